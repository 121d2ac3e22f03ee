"""A finished chat completion as a Server-Sent Events stream of `chat.completion.chunk`s.

The gateway must see the whole response to record it (token ids, logprobs, usage), so a streaming request
is answered once the completion is done: the same content and tool calls, in the chunk format streaming
clients parse. The scripted server streams its replies the same way, split into several content chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

DONE = b"data: [DONE]\n\n"


def completion_chunks(completion: dict[str, Any], *, include_usage: bool = False,
                      content_pieces: int = 1) -> Iterator[dict[str, Any]]:
    """The chunks of `completion` (a `chat.completion` body): per choice, the role, the content (in up to
    `content_pieces` pieces), the tool calls, then the finish reason; a usage-only chunk last if asked."""
    base = {key: completion[key] for key in ("id", "created", "model", "system_fingerprint") if key in completion}
    base["object"] = "chat.completion.chunk"
    for choice in completion.get("choices", []):
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        yield _chunk(base, index, {"role": message.get("role", "assistant"), "content": ""})
        if message.get("reasoning_content"):
            yield _chunk(base, index, {"reasoning_content": message["reasoning_content"]})
        for piece in _split(message.get("content") or "", content_pieces):
            yield _chunk(base, index, {"content": piece})
        tool_calls = message.get("tool_calls") or []
        if tool_calls:
            yield _chunk(base, index, {"tool_calls": [{"index": position, **call}
                                                      for position, call in enumerate(tool_calls)]})
        last = _chunk(base, index, {}, finish_reason=choice.get("finish_reason") or "stop")
        if choice.get("logprobs") is not None:
            last["choices"][0]["logprobs"] = choice["logprobs"]
        if choice.get("token_ids") is not None:
            last["choices"][0]["token_ids"] = choice["token_ids"]
        yield last
    if include_usage and completion.get("usage") is not None:
        yield {**base, "choices": [], "usage": completion["usage"]}


def sse_event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _chunk(base: dict[str, Any], index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}]}


def _split(text: str, pieces: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[start:start + size] for start in range(0, len(text), size)]
