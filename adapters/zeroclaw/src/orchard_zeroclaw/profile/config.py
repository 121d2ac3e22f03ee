"""The profile's settings. The defaults are ZeroClaw 0.8.4's where it has one (history of 50 messages, 60 s per
shell command, tool results cut at 50 000 characters, the workspace as the only place file tools reach);
`step_limit` is the task turn's `max_tool_iterations`, 50 here against ZeroClaw's 10, which is too few for a
repository task."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_AGENTS = {"worker": "a general-purpose agent with the same tools (it cannot delegate further)"}
AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")


class ProfileConfig(BaseModel):
    """Limits end a run cleanly (`exit_status` names the one that did); `None` turns a limit off."""

    model_config = ConfigDict(extra="forbid")

    step_limit: int | None = Field(default=50, gt=0, description="model calls of the main agent at most")
    wall_time_limit_s: float | None = Field(default=1800, gt=0, description="checked before each model call")
    max_history_messages: int = Field(
        default=50, ge=4, description="non-system messages kept; beyond it the middle is dropped (history.py)")
    shell_timeout_s: float = Field(default=60, gt=0, description="per shell command (ZeroClaw's shell_timeout_secs)")
    max_tool_result_chars: int = Field(default=50_000, ge=200, description="longer results keep head and tail")
    workspace_only: bool = Field(default=True, description="file tools refuse paths outside the task's workdir")
    agents: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_AGENTS),
        description="the agents `delegate` can reach: name -> what it is for (they run with the same model)")
    delegate_step_limit: int = Field(default=20, gt=0, description="model calls of one delegated run at most")
    request_params: dict = Field(default_factory=dict,
                                 description="extra chat-completions fields (the model config's sampling wins)")

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, agents: dict[str, str]) -> dict[str, str]:
        for name in agents:
            if not AGENT_NAME.match(name):
                raise ValueError(f"sub-agent name {name!r}: a letter, then up to 31 letters, digits, '_' or '-'")
        return agents
