"""The OpenHands driver: run inside the sandbox by the openhands bundle's own Python (3.13), never imported by
Orchard (it imports the OpenHands SDK, which lives only in the bundle). The adapter (harness.py) writes this
file into the sandbox, outside the task's workdir, and runs it as

    <bundle>/venv/bin/python driver.py CONFIG.json

with the gateway's key in the environment (ORCHARD_OPENHANDS_API_KEY). It runs the SDK's own agent as its
default preset builds it (terminal, file_editor, task_tracker, finish, think; no browser: cli mode) on one
message, the task's instruction, in a local conversation whose workspace is the task's workdir and whose
events the SDK persists under the config's `persistence_dir` (events/event-NNNNN-<id>.json). Beside them it
appends, as each observation arrives, the text the model is shown for it (`observations.jsonl`: the SDK's own
`to_llm_message`), and at the end writes `result.json`: how the conversation ended.

Exit codes: 0 the conversation ran to its end (finished, stuck, or its iteration limit: result.json says
which); 3 the conversation failed (its model calls failed, or the agent raised): result.json has the error;
anything else is a crash before the conversation could start (the traceback is on stderr)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid
import warnings
from pathlib import Path

RUN_FAILED = 3
DRIVER_ONLY_ENV = ("OPENHANDS_SUPPRESS_BANNER", "LITELLM_LOCAL_MODEL_COST_MAP", "LOG_LEVEL", "LOG_RICH_TRACEBACKS",
                   "PYTHONUNBUFFERED", "NO_COLOR")


def main(config_path: str) -> int:
    config = json.loads(Path(config_path).read_text())
    state = Path(config["state_dir"])
    observations = (state / "observations.jsonl").open("a", encoding="utf-8")
    result_path = state / "result.json"

    import litellm  # noqa: F401  (imported now, while LITELLM_LOCAL_MODEL_COST_MAP is set: no fetch)
    from openhands.sdk import LLM, Conversation
    from openhands.sdk.conversation.exceptions import ConversationRunError
    from openhands.sdk.event import LLMConvertibleEvent
    from openhands.sdk.event.llm_convertible import ActionEvent, MessageEvent
    from openhands.sdk.event.llm_convertible.observation import ObservationBaseEvent
    from openhands.sdk.llm import content_to_str
    from openhands.tools.preset.default import get_default_agent
    from pydantic import SecretStr

    warnings.filterwarnings("ignore")  # litellm's cost-map misses for unknown models, on every call
    for name in DRIVER_ONLY_ENV:  # read at import; the agent's shell gets the task's own environment
        os.environ.pop(name, None)
    api_key = os.environ.pop("ORCHARD_OPENHANDS_API_KEY", "") or "none"

    def keep_observation(event) -> None:
        """What the model is shown for each event it did not write (system prompt, user messages, tool
        results), as the SDK renders it: the text the adapter gives the trajectory's steps."""
        if not isinstance(event, LLMConvertibleEvent) or isinstance(event, ActionEvent):
            return
        if isinstance(event, MessageEvent) and event.source == "agent":
            return
        row = {"event_id": event.id, "text": "\n".join(content_to_str(event.to_llm_message().content))}
        if isinstance(event, ObservationBaseEvent):
            row["tool_call_id"] = event.tool_call_id
        observations.write(json.dumps(row) + "\n")
        observations.flush()

    sampling = config.get("sampling") or {}
    llm = LLM(model=config["model"], base_url=config["base_url"],
              api_key=SecretStr(api_key),
              usage_id="agent", api_mode="chat", native_tool_calling=True, stream=False,
              num_retries=config["num_retries"], retry_min_wait=config["retry_wait_s"],
              retry_max_wait=config["retry_wait_s"], retry_multiplier=1.0, timeout=config["request_timeout_s"],
              temperature=sampling.get("temperature"), top_p=sampling.get("top_p"),
              max_output_tokens=sampling.get("max_tokens"), seed=sampling.get("seed"),
              reasoning_effort=config.get("reasoning_effort"),
              litellm_extra_body={**(sampling.get("extra_body") or {}),
                                  **({"stop": sampling["stop"]} if sampling.get("stop") else {})})
    agent = get_default_agent(llm=llm, cli_mode=True)
    if config.get("mcp_servers"):  # the task's tools over MCP: the agent's own client lists and calls them
        from openhands.sdk.mcp.config import coerce_mcp_config

        agent = agent.model_copy(update={"mcp_config": coerce_mcp_config({"mcpServers": config["mcp_servers"]})})
    conversation = Conversation(agent=agent, workspace=config["workdir"], persistence_dir=config["persistence_dir"],
                                conversation_id=uuid.UUID(config["conversation_id"]), callbacks=[keep_observation],
                                max_iteration_per_run=config["max_iterations"], visualizer=None,
                                delete_on_close=False)
    started = time.monotonic()
    outcome: dict = {"conversation_id": config["conversation_id"]}
    code = 0
    try:
        conversation.send_message(config["instruction"])
        conversation.run()
    except ConversationRunError as exc:
        cause = exc.__cause__ or exc
        outcome["error"] = f"{type(cause).__name__}: {cause}"
        outcome["error_kind"] = _error_kind(cause)
        traceback.print_exc()
        code = RUN_FAILED
    finally:
        outcome["status"] = str(getattr(conversation.state.execution_status, "value",
                                        conversation.state.execution_status))
        outcome["run_s"] = round(time.monotonic() - started, 3)
        outcome["usage"] = {usage.response_id: {"prompt_tokens": usage.prompt_tokens,
                                                "completion_tokens": usage.completion_tokens,
                                                "cache_read_tokens": usage.cache_read_tokens}
                            for usage in agent.llm.metrics.token_usages if usage.response_id}
        outcome["tools"] = _tool_schemas(conversation)
        tmp = result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome))
        tmp.replace(result_path)
        observations.close()
        conversation.close()
    return code


def _tool_schemas(conversation) -> list:
    """The tools as the model is offered them (the OpenAI schemas the SDK's LLM sends), [] before the agent
    was ready."""
    try:
        tools = conversation.agent.tools_map.values()
        return [tool.to_openai_tool(add_security_risk_prediction=True) for tool in tools]
    except Exception:  # the agent never got ready: the events say what there is
        return []


def _error_kind(exc: BaseException) -> str:
    """`model` when the model could not be had (the SDK's LLM errors, litellm's API errors), else `agent`."""
    for cls in type(exc).__mro__:
        module = cls.__module__ or ""
        if module.startswith(("litellm", "openai", "httpx")) or module.startswith("openhands.sdk.llm"):
            return "model"
    return "agent"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
