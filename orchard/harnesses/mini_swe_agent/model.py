"""mini-swe-agent's `Model` protocol, calling the model through Orchard's gateway.

It mirrors the package's `LitellmModel` (tool-calling mode, the v2 default: one `bash` tool) and
`LitellmTextbasedModel` (text mode: the action is parsed from a fenced block in the reply), using the
package's own parsing and observation formatting, but sends the request with Orchard's OpenAI-compatible
client to `ModelConfig.base_url`, so the gateway records the call under the rollout key. No retries here:
the gateway's `num_retries` decides those."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Literal

from minisweagent.exceptions import FormatError, LimitsExceeded
from minisweagent.models import GLOBAL_MODEL_STATS
from minisweagent.models.utils import actions_text, actions_toolcall
from minisweagent.models.utils.openai_multimodal import expand_multimodal_content
from pydantic import BaseModel, ConfigDict, model_validator

from orchard.core.errors import BudgetExceeded, OrchardError
from orchard.harnesses.mini_swe_agent.bridge import LoopBridge
from orchard.harnesses.openai_client import ChatClient, Completion

Mode = Literal["toolcall", "text"]

# litellm's own switches in the package's config files (e.g. `drop_params`): they configure litellm, not
# the request, and only the gateway's routes may set them.
LITELLM_ONLY_KWARGS = frozenset({"drop_params", "num_retries", "api_base", "api_key", "custom_llm_provider"})

# The package's defaults (LitellmModelConfig / LitellmTextbasedModelConfig), for configs that do not set them.
DEFAULT_OBSERVATION_TEMPLATE = (
    "{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n{% endif %}"
    "<returncode>{{output.returncode}}</returncode>\n<output>\n{{output.output}}</output>")
DEFAULT_TOOLCALL_FORMAT_ERROR_TEMPLATE = "{{ error }}"
DEFAULT_TEXT_FORMAT_ERROR_TEMPLATE = ("Please always provide EXACTLY ONE action in triple backticks, found "
                                      "{{actions|length}} actions.")
DEFAULT_ACTION_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"


class ModelCallFailed(Exception):
    """The model could not be called (unreachable, refused, failed): the rollout is an error."""


class GatewayModelConfig(BaseModel):
    # The package's config files also carry litellm-only keys (litellm_model_registry, set_cache_control,
    # cost_tracking, model_class); they do not apply here and are ignored.
    model_config = ConfigDict(extra="ignore")

    model_name: str
    mode: Mode = "toolcall"
    model_kwargs: dict[str, Any] = {}
    observation_template: str = DEFAULT_OBSERVATION_TEMPLATE
    format_error_template: str = DEFAULT_TOOLCALL_FORMAT_ERROR_TEMPLATE
    action_regex: str = DEFAULT_ACTION_REGEX
    multimodal_regex: str = ""

    @model_validator(mode="after")
    def _text_mode_default_error_template(self) -> GatewayModelConfig:
        if self.mode == "text" and "format_error_template" not in self.model_fields_set:
            self.format_error_template = DEFAULT_TEXT_FORMAT_ERROR_TEMPLATE
        return self


class GatewayModel:
    def __init__(self, *, client: ChatClient, bridge: LoopBridge, config_class: type = GatewayModelConfig,
                 **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self.client = client
        self.bridge = bridge

    def query(self, messages: list[dict], **kwargs: Any) -> dict:
        prepared = [{key: value for key, value in message.items() if key != "extra"} for message in messages]
        params = {key: value for key, value in (self.config.model_kwargs | kwargs).items()
                  if key not in LITELLM_ONLY_KWARGS}
        tools = [actions_toolcall.BASH_TOOL] if self.config.mode == "toolcall" else None
        try:
            completion = self.bridge.call(self.client.complete(prepared, tools=tools, params=params))
        except BudgetExceeded as exc:  # the rollout's budget at the gateway: a limit, as the agent's own are
            raise LimitsExceeded({"role": "exit", "content": "LimitsExceeded", "extra": {
                "exit_status": "LimitsExceeded", "submission": "", "limit": "budget_exhausted",
                "reason": str(exc)}}) from None
        except OrchardError as exc:
            raise ModelCallFailed(f"model call failed: {exc}") from exc
        cost = completion.metrics().cost_usd or 0.0
        GLOBAL_MODEL_STATS.add(cost)
        try:
            actions = self._parse_actions(completion)
        except FormatError as exc:  # the package's contract: a rejected response is kept, with its cost
            exc.messages[0]["extra"].update({"cost": cost, "response": completion.body})
            raise
        message = dict(completion.body["choices"][0]["message"])
        message["extra"] = {"actions": actions, "response": completion.body, "cost": cost,
                            "timestamp": time.time()}
        return message

    def _parse_actions(self, completion: Completion) -> list[dict]:
        template_kwargs = {"finish_reason": completion.finish_reason}
        if self.config.mode == "text":
            return actions_text.parse_regex_actions(
                completion.content or "", action_regex=self.config.action_regex,
                format_error_template=self.config.format_error_template, template_kwargs=template_kwargs)
        # the package's parser reads attribute-style tool calls, as litellm returns them
        tool_calls = [SimpleNamespace(id=call.id, function=SimpleNamespace(name=call.name, arguments=call.arguments))
                      for call in completion.tool_calls]
        return actions_toolcall.parse_toolcall_actions(
            tool_calls, format_error_template=self.config.format_error_template, template_kwargs=template_kwargs)

    def format_message(self, **kwargs: Any) -> dict:
        return expand_multimodal_content(kwargs, pattern=self.config.multimodal_regex)

    def format_observation_messages(self, message: dict, outputs: list[dict],
                                    template_vars: dict | None = None) -> list[dict]:
        if self.config.mode == "text":
            return actions_text.format_observation_messages(
                outputs, observation_template=self.config.observation_template, template_vars=template_vars,
                multimodal_regex=self.config.multimodal_regex)
        return actions_toolcall.format_toolcall_observation_messages(
            actions=message.get("extra", {}).get("actions", []), outputs=outputs,
            observation_template=self.config.observation_template, template_vars=template_vars,
            multimodal_regex=self.config.multimodal_regex)

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return self.config.model_dump()

    def serialize(self) -> dict:
        return {"info": {"config": {
            "model": self.config.model_dump(mode="json"),
            "model_type": f"{self.__class__.__module__}.{self.__class__.__name__}"}}}
