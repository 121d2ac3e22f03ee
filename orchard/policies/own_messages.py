"""Reading a conversation as a scripted model (the oracle, the harness conformance suite's stand-in): which
assistant messages it wrote itself, and a message's text."""

from __future__ import annotations

from typing import Any


def is_own_message(message: dict[str, Any], *, mark: str, call_id_prefix: str) -> bool:
    """An assistant message the model wrote: `mark` in its text, or a tool-call id starting with
    `call_id_prefix` (either survives harnesses that drop the other)."""
    if message.get("role") != "assistant":
        return False
    if mark in message_text(message.get("content")):
        return True
    return any(isinstance(call, dict) and str(call.get("id", "")).startswith(call_id_prefix)
               for call in message.get("tool_calls") or [])


def message_text(content: Any) -> str:
    """A message's content as text: a string as is, OpenAI content parts' text joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
