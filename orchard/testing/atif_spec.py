"""An independent validator of ATIF documents, written from ATIF's specification (Harbor's RFC 0001,
ATIF-v1.6 and ATIF-v1.7) and not from Orchard's models: what Orchard exports must pass it.

Each object forbids fields its version does not define, and numbers are finite (JSON has no NaN or
Infinity). The rules beyond field types are the RFC's and its schema's: a trajectory has at least one step
(the schema's `minItems: 1`, at every version and in embedded subagent trajectories); step ids run 1, 2, 3,
...; an observation result's `source_call_id` names a tool call of the same step; tool call ids are unique
within a step; model_name, reasoning_effort, reasoning_content, tool_calls and metrics are only for agent
steps; timestamps are ISO 8601. v1.6 -> v1.7: `extra` on tool calls and observation results,
`llm_call_count` on steps (0 on an agent step: no metrics, no reasoning), `trajectory_id` and
`subagent_trajectories` (each embedded one with a unique trajectory_id) on the root, `session_id` optional
on the root and on subagent references, which must then name a trajectory_id or a trajectory_path."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

Number = Union[StrictInt, StrictFloat]
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# --- ATIF-v1.6 -------------------------------------------------------------------------------------

class ImageSource16(Spec):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: StrictStr


class ContentPart16(Spec):
    type: Literal["text", "image"]
    text: StrictStr | None = None
    source: ImageSource16 | None = None

    @model_validator(mode="after")
    def _payload(self) -> ContentPart16:
        if self.type == "text" and (self.text is None or self.source is not None):
            raise ValueError("a text part has `text` and no `source`")
        if self.type == "image" and (self.source is None or self.text is not None):
            raise ValueError("an image part has `source` and no `text`")
        return self


class ToolCall16(Spec):
    tool_call_id: StrictStr
    function_name: StrictStr
    arguments: dict[str, Any]


class SubagentRef16(Spec):
    session_id: StrictStr
    trajectory_path: StrictStr | None = None
    extra: dict[str, Any] | None = None


class ObservationResult16(Spec):
    source_call_id: StrictStr | None = None
    content: StrictStr | list[ContentPart16] | None = None
    subagent_trajectory_ref: list[SubagentRef16] | None = None


class Observation16(Spec):
    results: list[ObservationResult16]


class Metrics16(Spec):
    prompt_tokens: StrictInt | None = Field(default=None, ge=0)
    completion_tokens: StrictInt | None = Field(default=None, ge=0)
    cached_tokens: StrictInt | None = Field(default=None, ge=0)
    cost_usd: Number | None = Field(default=None, ge=0)
    prompt_token_ids: list[StrictInt] | None = None
    completion_token_ids: list[StrictInt] | None = None
    logprobs: list[Number] | None = None
    extra: dict[str, Any] | None = None


class FinalMetrics16(Spec):
    total_prompt_tokens: StrictInt | None = Field(default=None, ge=0)
    total_completion_tokens: StrictInt | None = Field(default=None, ge=0)
    total_cached_tokens: StrictInt | None = Field(default=None, ge=0)
    total_cost_usd: Number | None = Field(default=None, ge=0)
    total_steps: StrictInt | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None


class AgentSchema16(Spec):
    name: StrictStr
    version: StrictStr
    model_name: StrictStr | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class Step16(Spec):
    step_id: StrictInt = Field(ge=1)
    timestamp: StrictStr | None = None
    source: Literal["system", "user", "agent"]
    model_name: StrictStr | None = None
    reasoning_effort: StrictStr | Number | None = None
    message: StrictStr | list[ContentPart16]
    reasoning_content: StrictStr | None = None
    tool_calls: list[ToolCall16] | None = None
    observation: Observation16 | None = None
    metrics: Metrics16 | None = None
    is_copied_context: StrictBool | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _rules(self) -> Step16:
        if self.timestamp is not None:
            try:
                datetime.fromisoformat(self.timestamp.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"step {self.step_id}: timestamp {self.timestamp!r} is not ISO 8601") from None
        if self.source != "agent":
            present = [name for name in AGENT_ONLY if getattr(self, name) is not None]
            if present:
                raise ValueError(f"step {self.step_id}: {present[0]} is only for agent steps")
        ids = [call.tool_call_id for call in self.tool_calls or []]
        if len(ids) != len(set(ids)):
            raise ValueError(f"step {self.step_id}: duplicate tool_call_id")
        for result in self.observation.results if self.observation else []:
            if result.source_call_id is not None and result.source_call_id not in ids:
                raise ValueError(f"step {self.step_id}: source_call_id {result.source_call_id!r} is no tool call "
                                 "of this step")
        return self


class Trajectory16(Spec):
    schema_version: Literal["ATIF-v1.6"]
    session_id: StrictStr
    agent: AgentSchema16
    steps: list[Step16] = Field(min_length=1)
    notes: StrictStr | None = None
    final_metrics: FinalMetrics16 | None = None
    continued_trajectory_ref: StrictStr | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _step_ids(self) -> Trajectory16:
        for index, step in enumerate(self.steps, start=1):
            if step.step_id != index:
                raise ValueError(f"steps[{index - 1}].step_id is {step.step_id}, expected {index}")
        return self


# --- ATIF-v1.7 -------------------------------------------------------------------------------------

class ToolCall17(ToolCall16):
    extra: dict[str, Any] | None = None


class SubagentRef17(Spec):
    trajectory_id: StrictStr | None = None
    trajectory_path: StrictStr | None = None
    session_id: StrictStr | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resolvable(self) -> SubagentRef17:
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent reference needs trajectory_id or trajectory_path")
        return self


class ObservationResult17(ObservationResult16):
    subagent_trajectory_ref: list[SubagentRef17] | None = None
    extra: dict[str, Any] | None = None


class Observation17(Spec):
    results: list[ObservationResult17]


class Step17(Step16):
    tool_calls: list[ToolCall17] | None = None
    observation: Observation17 | None = None
    llm_call_count: StrictInt | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _no_llm_dispatch(self) -> Step17:
        if self.source == "agent" and self.llm_call_count == 0 and (
                self.metrics is not None or self.reasoning_content is not None):
            raise ValueError(f"step {self.step_id}: llm_call_count 0 means no metrics and no reasoning_content")
        return self


class Trajectory17(Trajectory16):
    schema_version: Literal["ATIF-v1.7"]
    session_id: StrictStr | None = None
    trajectory_id: StrictStr | None = None
    steps: list[Step17] = Field(min_length=1)
    subagent_trajectories: list[Trajectory17] | None = None

    @model_validator(mode="after")
    def _embedded_ids(self) -> Trajectory17:
        ids = [sub.trajectory_id for sub in self.subagent_trajectories or []]
        if any(i is None for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("embedded subagent trajectories need unique trajectory_ids")
        return self


SCHEMAS: dict[str, type[Spec]] = {"ATIF-v1.6": Trajectory16, "ATIF-v1.7": Trajectory17}


def validate_atif(document: dict[str, Any]) -> Spec:
    """The document validated against the ATIF version it declares (v1.6 or v1.7); raises ValidationError
    or ValueError naming what is wrong."""
    version = document.get("schema_version")
    if version not in SCHEMAS:
        raise ValueError(f"this validator knows {sorted(SCHEMAS)}, the document declares {version!r}")
    return SCHEMAS[version].model_validate(document)
