"""What the scripted server replays: a list of responses (content and/or tool calls), in order.

A script file is JSON: either a bare list of responses or `{"responses": [...], "loop": false,
"delay_s": 0}`. Token ids, when a response does not give its own, come from a byte-level tokenizer
(one token per UTF-8 byte), so ids, logprobs and usage counts always agree with the text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchard.core.errors import InvalidRequest, first_problem, NotFound


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict, description="an object or a JSON string")
    id: str | None = Field(default=None, description="default: call_<response>_<position>")

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


class ScriptedResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    reasoning_content: str | None = None
    finish_reason: str | None = Field(default=None, description="default: tool_calls if any, else stop")
    delay_s: float | None = Field(default=None, ge=0, description="wait before answering (default: the script's)")
    completion_token_ids: list[int] | None = Field(default=None, description="default: the text's UTF-8 bytes")
    logprobs: list[float] | None = Field(default=None, description="one per completion token; default 0.0")

    @model_validator(mode="after")
    def _says_something(self) -> ScriptedResponse:
        if self.content is None and not self.tool_calls:
            raise ValueError("a scripted response needs `content`, `tool_calls` or both")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids()):
            raise ValueError(f"`logprobs` has {len(self.logprobs)} entries but the response has "
                             f"{len(self.token_ids())} completion tokens; give one logprob per token")
        return self

    def text(self) -> str:
        """What the byte tokenizer counts: the content, then each tool call as `{"name", "arguments"}`."""
        calls = "".join(json.dumps({"name": call.name, "arguments": call.arguments_json()})
                        for call in self.tool_calls)
        return (self.content or "") + calls

    def token_ids(self) -> list[int]:
        return self.completion_token_ids if self.completion_token_ids is not None else byte_tokens(self.text())

    def token_logprobs(self) -> list[float]:
        # A script emits its text with certainty, so each token's default log-probability is log(1) = 0.
        return self.logprobs if self.logprobs is not None else [0.0] * len(self.token_ids())


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    responses: list[ScriptedResponse] = Field(min_length=1)
    loop: bool = Field(default=False, description="start over after the last response instead of failing")
    delay_s: float = Field(default=0.0, ge=0, description="default wait before each answer")

    @classmethod
    def load(cls, path: str | Path) -> Script:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFound(f"script file {path} does not exist") from None
        except (ValueError, IsADirectoryError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"script file {path} is not JSON: {exc}") from None
        return cls.parse(data, where=str(path))

    @classmethod
    def parse(cls, data: Any, *, where: str = "script") -> Script:
        if isinstance(data, list):
            data = {"responses": data}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidRequest(f"{where} is not a valid script ({first_problem(exc.errors(), 'script')}); "
                                 "expected a list of "
                                 '{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}') from None


def byte_tokens(text: str) -> list[int]:
    return list(text.encode())


def byte_token_text(token_id: int) -> str:
    """How OpenAI names a token that is not text on its own: `bytes:\\xNN`."""
    return chr(token_id) if token_id < 0x80 else f"bytes:\\x{token_id:02x}"


def render_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The text the byte tokenizer reads for a prompt: a chat-template-like rendering of the request."""
    parts = [f"<|tools|>\n{json.dumps(tools, sort_keys=True)}\n"] if tools else []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        text = content or ""
        if message.get("tool_calls"):
            text += json.dumps(message["tool_calls"], sort_keys=True)
        parts.append(f"<|{message.get('role', 'user')}|>\n{text}\n")
    return "".join(parts) + "<|assistant|>\n"
