"""The sampling parameters of a chat request that smollm2 honours (OpenAI names), checked before the model
loads."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchard.core.errors import InvalidRequest, first_problem

DEFAULT_MAX_TOKENS = 512
# Sampling keeps the 50 most likely tokens before top-p: transformers' default top_k, which `generate`
# applies when top_k is None, so it is what this model has always sampled with.
SAMPLING_TOP_K = 50
END_OF_TURN = "<|im_end|>"


class SamplingRequest(BaseModel):
    """The sampling parameters of a chat request that this model honours; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    n: int = Field(default=1, ge=1, le=1, description="one completion per call")
    top_logprobs: int = Field(default=0, ge=0, le=20)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @property
    def sampled(self) -> bool:
        return bool(self.temperature)

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS


def sampling_request(params: dict[str, Any]) -> SamplingRequest:
    try:
        return SamplingRequest.model_validate(params)
    except ValidationError as exc:
        raise InvalidRequest(f"smollm2 cannot honour {first_problem(exc.errors(), 'request')}") from None
