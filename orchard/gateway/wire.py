"""The OpenAI chat-completions request as the gateway and the scripted server accept it.

Only what Orchard reads is typed; every other field (sampling parameters, `logprobs`, `response_format`,
provider extras such as vLLM's `return_token_ids`) is kept as given and passed on."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="a gateway alias or any litellm model string")
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    def params(self) -> dict[str, Any]:
        """Everything but the model, the messages and the streaming switches: what is passed on."""
        return self.model_dump(exclude={"model", "messages", "stream", "stream_options"}, exclude_none=True)

    @property
    def wants_stream_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))
