"""The ReAct harness's settings: prompts, limits, and how tool output is cut to size."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchard.harnesses.react.prompts import (
    DEFAULT_INSTANCE_TEMPLATE,
    DEFAULT_SYSTEM_TEMPLATE,
    check_template,
)


class ReActConfig(BaseModel):
    """Limits end a run cleanly (the trajectory's `extra["exit_status"]` names the one that did); `None`
    turns a limit off. Templates are `string.Template` text with `$instruction`, `$workdir`, `$task_id`."""

    model_config = ConfigDict(extra="forbid")

    system_template: str = DEFAULT_SYSTEM_TEMPLATE
    instance_template: str = DEFAULT_INSTANCE_TEMPLATE
    step_limit: int | None = Field(default=50, gt=0, description="model calls (agent steps) at most")
    wall_time_limit_s: float | None = Field(
        default=1800, gt=0, description="checked before each model call; commands are cut to what is left")
    token_limit: int | None = Field(
        default=None, gt=0, description="prompt + completion tokens summed over calls, from `usage`")
    max_observation_chars: int = Field(
        default=10_000, ge=200, description="longer tool output keeps its head and tail around a marker")
    command_timeout_s: float = Field(default=120, gt=0, description="default and maximum per bash command")
    request_params: dict = Field(
        default_factory=dict, description="extra chat-completions fields (the model config's sampling wins)")

    @field_validator("system_template", "instance_template")
    @classmethod
    def _known_placeholders(cls, template: str) -> str:
        check_template(template)
        return template
