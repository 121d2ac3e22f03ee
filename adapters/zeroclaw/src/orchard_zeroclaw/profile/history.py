"""The profile's history cap. Before each model call, a conversation whose messages (the system prompt not
counted) number more than `max_history_messages` is compacted the way ZeroClaw's `trim_history` does it: the
first user message (the task: the anchor) is kept, the middle is dropped, the most recent messages are kept
(from an answer on, so that no tool result loses its call), and ZeroClaw's breadcrumb follows the anchor so
the model sees that earlier turns were cut. Unlike ZeroClaw, which trims back to exactly the limit (and so
again at every later call), the profile keeps about half of the limit: a cut happens once per that many
messages, and the trajectory repeats the kept context once per cut (`is_copied_context`) rather than at every
step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BREADCRUMB = "[earlier turns omitted to fit the context window]"  # ZeroClaw's `history-trim-breadcrumb`
REASON = "message limit"


@dataclass
class Trim:
    """A cut: the conversation after it, how many messages went, and the messages kept from before it (the
    anchor first) that the trajectory repeats as copied context."""

    messages: list[dict[str, Any]]
    dropped_messages: int
    kept: list[dict[str, Any]] = field(default_factory=list)

    def frame(self) -> dict[str, Any]:
        """The cut as ZeroClaw's gateway reports one (its `history_trimmed` frame)."""
        return {"type": "history_trimmed", "dropped_messages": self.dropped_messages, "kept_turns": 1,
                "reason": REASON}


def trim_history(messages: list[dict[str, Any]], max_history: int) -> Trim | None:
    """The cut `messages` (system prompt first, then the anchor) need, or None when they fit."""
    system, body = messages[:1], messages[1:]
    if len(body) <= max_history or len(body) < 3:
        return None
    anchor, rest = body[0], body[1:]
    start = len(rest) - max(2, max_history // 2 - 1)  # about half the limit, the anchor and breadcrumb besides
    while start > 0 and rest[start].get("role") == "tool":  # whole tool calls: from the answer that made them
        start -= 1
    tail = without_orphans(rest[max(start, 0):])
    breadcrumb = {"role": "user", "content": BREADCRUMB}
    return Trim(messages=[*system, anchor, breadcrumb, *tail], dropped_messages=len(rest) - len(tail),
                kept=[anchor, *tail])


def without_orphans(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` without the tool results whose call is not among them (its assistant message was cut)."""
    calls = {call.get("id") for message in messages if message.get("role") == "assistant"
             for call in message.get("tool_calls") or []}
    return [message for message in messages
            if message.get("role") != "tool" or message.get("tool_call_id") in calls]
