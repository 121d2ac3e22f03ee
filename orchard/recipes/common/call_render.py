"""One recorded model call as a student's chat template renders it: the prompt the policy saw (its request
messages and tools, with the generation prompt) and the completion it produced (its response, rendered the way
the template renders an assistant turn, ending with the end-of-turn token).

Templates that handle tools themselves get the messages and tools as they are (tool-call arguments parsed into
objects, as Hugging Face templates expect). Templates without tool support (SmolLM2's) get the same rewrite the
embedded policy applies before generating (orchard.policies.chat_render: tools in the system prompt, Hermes
`<tool_call>` blocks, `<tool_response>` turns), so a re-rendered prompt is the prompt that policy saw.

The completion is what the full conversation (prompt + response, no generation prompt) adds after the prompt
with its generation prompt; a template for which that is not a prefix (it rewrites earlier turns once a reply
follows) cannot give a faithful split and is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchard.core.trajectory import json_object
from orchard.policies.chat_render import render_for_template, template_supports_tools


class RenderError(ValueError):
    """The call cannot be rendered as a (prompt, completion) pair with this tokenizer."""


@dataclass(frozen=True)
class RenderedCall:
    prompt_text: str
    completion_text: str
    prompt_ids: list[int]
    completion_ids: list[int]


def response_message(response: dict[str, Any] | None) -> dict[str, Any] | None:
    """The assistant message of an OpenAI chat-completion body (its first choice), null fields dropped."""
    choices = (response or {}).get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return None
    kept = {key: value for key, value in message.items()
            if key in ("content", "tool_calls", "reasoning_content") and value not in (None, [])}
    return {"role": "assistant", "content": "", **kept}


def render_call(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                response: dict[str, Any]) -> RenderedCall:
    """The prompt and completion texts and token ids of one call, for `tokenizer`'s chat template."""
    native = template_supports_tools(getattr(tokenizer, "chat_template", None))
    conversation = [*messages, response]
    if native:
        conversation = [_parsed_arguments(message) for message in conversation]
    rendered, template_tools = render_for_template(conversation, tools, native_tools=native)
    try:
        prompt_text = tokenizer.apply_chat_template(rendered[:-1], tools=template_tools, add_generation_prompt=True,
                                                    tokenize=False)
        full_text = tokenizer.apply_chat_template(rendered, tools=template_tools, tokenize=False)
    except Exception as exc:  # jinja raises its own errors (TemplateError, TypeError...) for unexpected input
        raise RenderError(f"the chat template cannot render this call: {exc}") from None
    if not full_text.startswith(prompt_text):
        raise RenderError("the chat template renders the prompt differently once the response follows it, so "
                          "the completion cannot be split off")
    completion_text = _through_end_of_turn(full_text[len(prompt_text):], getattr(tokenizer, "eos_token", None))
    if not completion_text:
        raise RenderError("the response renders as an empty completion")
    prompt_ids, completion_ids = tokenizer([prompt_text, completion_text], add_special_tokens=False)["input_ids"]
    return RenderedCall(prompt_text, completion_text, list(prompt_ids), list(completion_ids))


def _through_end_of_turn(completion: str, end_of_turn: str | None) -> str:
    """The turn up to and including its end-of-turn token: what follows it (a newline, in ChatML) belongs to
    no turn and is never generated. A template whose turns end otherwise keeps its turn as rendered."""
    if end_of_turn:
        index = completion.rfind(end_of_turn)
        if index >= 0:
            return completion[:index + len(end_of_turn)]
    return completion


def _parsed_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as objects (templates write them with `tojson`); text that is not a JSON object
    stays text, as the model wrote it."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    parsed = []
    for call in calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        value = json_object(arguments) if isinstance(arguments, str) else None
        if value is not None:
            function["arguments"] = value
        parsed.append({**call, "function": function})
    return {**message, "tool_calls": parsed}
