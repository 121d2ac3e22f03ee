"""The one trajectory schema: a strict superset of ATIF (Harbor's Agent Trajectory Interchange Format).

Every ATIF field keeps its ATIF name and meaning. Orchard adds what evaluation and training need: the
per-call LLM records the gateway captures, the task, the outcome and per-rollout accounting. Each model
names its Orchard-only fields in `ORCHARD_FIELDS`; `orchard.core.atif` moves exactly those into ATIF's
`extra` objects (under the key `"orchard"`) and back, so an export is plain ATIF and re-imports losslessly.

ATIF -> Orchard names that are not obvious: `agent.name` / `agent.version` are the harness's name and
version, `agent.model_name` the model, `agent.tool_definitions` the tools offered (OpenAI tool schemas),
`final_metrics` the per-rollout accounting."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.core.run_status import ExitStatus, PhaseRecord
from orchard.core.sandbox import StartupTimings

ATIF_SCHEMA_VERSION = "ATIF-v1.6"
SUPPORTED_ATIF_VERSIONS = tuple(f"ATIF-v1.{minor}" for minor in range(8))
ORCHARD_EXTRA_KEY = "orchard"

StepSource = Literal["system", "user", "agent"]


class StrictModel(BaseModel):
    """Unknown fields are errors: a typo or a field of a newer ATIF must not vanish silently."""

    model_config = ConfigDict(extra="forbid")


class AtifObject(StrictModel):
    """An object of the ATIF document; `ORCHARD_FIELDS` are its fields that ATIF does not have."""

    ORCHARD_FIELDS: ClassVar[frozenset[str]] = frozenset()


class ExtensibleAtifObject(AtifObject):
    """An ATIF object that has an `extra` object for custom metadata (and so can carry Orchard fields)."""

    extra: dict[str, Any] = Field(default_factory=dict, description="custom metadata (ATIF `extra`)")

    @field_validator("extra")
    @classmethod
    def _orchard_key_reserved(cls, extra: dict[str, Any]) -> dict[str, Any]:
        if ORCHARD_EXTRA_KEY in extra:
            raise ValueError(f"extra[{ORCHARD_EXTRA_KEY!r}] is reserved for Orchard's own fields in ATIF "
                             "exports; set those fields directly or use another key")
        return extra


# --- content ---------------------------------------------------------------------------------------

# Trajectory.extra: images a harness recorded (an observation's image parts name them by `path`), as
# {path: base64}, until the evaluator writes each to that path beside the trajectories and drops the map.
PENDING_IMAGES = "orchard.pending_images"
IMAGES_DIR = "images"
IMAGE_TYPES = {"image/jpeg": "jpg", "image/png": "png", "image/gif": "gif", "image/webp": "webp"}


class ImageSource(AtifObject):
    """ATIF v1.6: an image stored as a file (path relative to the trajectory file) or at a URL."""

    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: str


class ContentPart(AtifObject):
    """ATIF v1.6 multimodal content: one text or image part of a message or observation."""

    type: Literal["text", "image"]
    text: str | None = None
    source: ImageSource | None = None

    @model_validator(mode="after")
    def _part_has_its_payload(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a text content part needs `text`")
        if self.type == "image" and self.source is None:
            raise ValueError("an image content part needs `source`")
        return self


Content = str | list[ContentPart]


# --- actions and observations ----------------------------------------------------------------------

class ToolCall(ExtensibleAtifObject):
    """One tool call. `arguments` is ATIF's parsed object; `raw_arguments` (Orchard) is the arguments text
    exactly as the model wrote it, kept so that training replays what the model produced: a malformed call
    (`arguments_valid` False, `arguments` then `{}`) stays malformed, and valid JSON keeps its spacing and
    key order."""

    ORCHARD_FIELDS: ClassVar[frozenset[str]] = frozenset({"raw_arguments"})

    tool_call_id: str = Field(min_length=1)
    function_name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = Field(
        default=None, description="Orchard: the arguments text as the model produced it; None when unknown")

    @property
    def arguments_valid(self) -> bool:
        """False when the model's arguments text is not a JSON object (truncated, not JSON, a list...)."""
        return self.raw_arguments is None or json_object(self.raw_arguments) is not None

    @classmethod
    def from_openai(cls, call: Mapping[str, Any], *, default_id: str = "unknown") -> ToolCall:
        """An entry of an OpenAI chat message's `tool_calls`: the arguments text the model wrote is kept
        (`raw_arguments`) and parsed (`{}` when it is not a JSON object); arguments already given as an
        object have no text to keep."""
        function = call.get("function") or {}
        raw = function.get("arguments")
        if isinstance(raw, str):
            arguments = json_object(raw) or {}
        else:
            arguments, raw = (raw if isinstance(raw, dict) else {}), None
        return cls(tool_call_id=call.get("id") or default_id, function_name=function.get("name") or "unknown",
                   arguments=arguments, raw_arguments=raw)

    @model_validator(mode="after")
    def _raw_matches_parsed(self) -> ToolCall:
        parsed = None if self.raw_arguments is None else json_object(self.raw_arguments)
        if parsed is not None and parsed != self.arguments:
            raise ValueError(f"tool call {self.tool_call_id!r}: `arguments` must be `raw_arguments` parsed "
                             "(the raw text is a JSON object that differs from them)")
        return self


def json_object(text: str) -> dict[str, Any] | None:
    """`text` parsed when it is a JSON object (what tool-call arguments must be), else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class SubagentTrajectoryRef(ExtensibleAtifObject):
    """Where a delegated subagent's trajectory is: embedded (`trajectory_id`) or a file/URL."""

    session_id: str | None = None
    trajectory_id: str | None = None
    trajectory_path: str | None = None

    @model_validator(mode="after")
    def _points_somewhere(self) -> SubagentTrajectoryRef:
        if self.session_id is None and self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent_trajectory_ref needs session_id, trajectory_id or trajectory_path")
        return self


class ObservationResult(ExtensibleAtifObject):
    source_call_id: str | None = Field(
        default=None, description="tool_call_id this answers; None for results of non-tool actions")
    content: Content | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] = Field(default_factory=list)


class Observation(AtifObject):
    results: list[ObservationResult] = Field(default_factory=list)


# --- metrics ---------------------------------------------------------------------------------------

class TokenUsage(StrictModel):
    """Token counts, cost, token ids and logprobs of one model call (ATIF MetricsSchema's fields).
    `prompt_tokens` includes `cached_tokens`. Token ids are what the policy saw and produced: training
    uses them instead of re-tokenizing text."""

    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = Field(default=None, description="one per completion token")


class Metrics(ExtensibleAtifObject, TokenUsage):
    """ATIF step metrics: usage of the model call(s) that produced an agent step."""


class LLMCall(TokenUsage):
    """Orchard: one model call as the gateway recorded it. Steps point at their calls by `id`; calls that
    produced no step (e.g. a compaction summary) are kept too."""

    id: str = Field(min_length=1)
    rollout_key: str | None = Field(default=None, description="the rollout this call was billed to")
    model: str | None = None
    request_messages: list[dict[str, Any]] | None = Field(
        default=None, description="the chat messages sent (optional: large, and implied by the steps)")
    request_params: dict[str, Any] = Field(default_factory=dict, description="sampling params, tools, ...")
    response: dict[str, Any] | None = Field(default=None, description="the response body as returned")
    latency_s: float | None = Field(default=None, ge=0)
    started_at: str | None = Field(default=None, description="ISO 8601")
    error: str | None = Field(default=None, description="why the call failed, when it did")
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("started_at")
    @classmethod
    def _iso_started_at(cls, value: str | None) -> str | None:
        return _check_iso8601(value)


class FinalMetrics(ExtensibleAtifObject):
    """ATIF final_metrics, extended into Orchard's per-rollout accounting."""

    ORCHARD_FIELDS: ClassVar[frozenset[str]] = frozenset({"wall_time_s", "sandbox_cpu_s", "n_llm_calls",
                                                          "sandbox_startup"})

    total_prompt_tokens: int | None = Field(default=None, ge=0)
    total_completion_tokens: int | None = Field(default=None, ge=0)
    total_cached_tokens: int | None = Field(default=None, ge=0)
    total_cost_usd: float | None = Field(default=None, ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    wall_time_s: float | None = Field(default=None, ge=0, description="Orchard: rollout wall-clock time")
    sandbox_cpu_s: float | None = Field(default=None, ge=0, description="Orchard: CPU seconds in the sandbox")
    n_llm_calls: int | None = Field(default=None, ge=0, description="Orchard: model calls made")
    sandbox_startup: StartupTimings | None = Field(
        default=None, description="Orchard: where the start of the task's sandbox went, stage by stage")

    @classmethod
    def from_llm_calls(cls, calls: list[LLMCall], *, total_steps: int | None = None,
                       wall_time_s: float | None = None, sandbox_cpu_s: float | None = None,
                       sandbox_startup: StartupTimings | None = None) -> FinalMetrics:
        """Totals over `calls`; a total is None when no call reported that quantity."""

        def total(attribute: str) -> Any:
            values = [getattr(call, attribute) for call in calls if getattr(call, attribute) is not None]
            return sum(values) if values else None

        return cls(total_prompt_tokens=total("prompt_tokens"), total_completion_tokens=total("completion_tokens"),
                   total_cached_tokens=total("cached_tokens"), total_cost_usd=total("cost_usd"),
                   total_steps=total_steps, wall_time_s=wall_time_s, sandbox_cpu_s=sandbox_cpu_s,
                   sandbox_startup=sandbox_startup,
                   n_llm_calls=len(calls))


# --- steps -----------------------------------------------------------------------------------------

class Step(ExtensibleAtifObject):
    """One ATIF step: a system prompt, a user message, or an agent turn (model output, the tool calls it
    made and their observations)."""

    ORCHARD_FIELDS: ClassVar[frozenset[str]] = frozenset({"llm_call_ids"})

    step_id: int = Field(ge=1, description="1, 2, 3, ... in order")
    timestamp: str | None = Field(default=None, description="ISO 8601")
    source: StepSource
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: Content = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    observation: Observation | None = None
    metrics: Metrics | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    is_copied_context: bool = Field(
        default=False, description="repeated from an earlier context (e.g. after compaction): never trained on")
    llm_call_ids: list[str] = Field(default_factory=list, description="Orchard: the LLMCall ids of this step")

    @field_validator("timestamp")
    @classmethod
    def _iso_timestamp(cls, value: str | None) -> str | None:
        return _check_iso8601(value)

    @model_validator(mode="after")
    def _tool_calls_and_results_link(self) -> Step:
        if self.tool_calls and self.source != "agent":
            raise ValueError(f"step {self.step_id}: only agent steps make tool calls (source is {self.source!r})")
        call_ids = [call.tool_call_id for call in self.tool_calls]
        duplicates = sorted({i for i in call_ids if call_ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"step {self.step_id}: tool_call_id {duplicates[0]!r} is used twice in one step")
        for result in self.observation.results if self.observation else []:
            if result.source_call_id is not None and result.source_call_id not in call_ids:
                raise ValueError(
                    f"step {self.step_id}: observation result references tool call {result.source_call_id!r}, "
                    f"but this step's tool calls are {call_ids}; a result's source_call_id must be the "
                    "tool_call_id of a call in the same step, or null for a non-tool action")
        return self


# --- outcome and the trajectory --------------------------------------------------------------------

class Outcome(StrictModel):
    """Orchard: how the rollout ended. `error` means the attempt did not happen properly (the model API or
    the sandbox failed): such a rollout is retried or excluded, never counted as a failed attempt."""

    reward: float | None = None
    resolved: bool | None = None
    error: str | None = None
    details: dict[str, Any] = Field(default_factory=dict, description="the grader's details (tests run, ...)")

    @model_validator(mode="after")
    def _error_is_not_a_result(self) -> Outcome:
        if self.error is not None and self.resolved:
            raise ValueError("an outcome with an error cannot be resolved: the attempt did not complete")
        return self

    @property
    def counts_as_attempt(self) -> bool:
        return self.error is None


class Agent(ExtensibleAtifObject):
    """ATIF agent: the harness (`name`, `version`), its default model and the tools it offered."""

    name: str = Field(min_length=1)
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] = Field(default_factory=list, description="OpenAI tool schemas")


class Trajectory(ExtensibleAtifObject):
    """One rollout of a harness on a task: the ATIF document plus Orchard's records about it."""

    ORCHARD_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"task_id", "rollout_key", "outcome", "llm_calls", "exit_status", "partial", "phases"})

    schema_version: str = ATIF_SCHEMA_VERSION
    session_id: str | None = Field(default_factory=lambda: uuid.uuid4().hex)
    trajectory_id: str | None = Field(default=None, description="ATIF v1.7: per-document id")
    agent: Agent
    steps: list[Step] = Field(default_factory=list)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    subagent_trajectories: list[Trajectory] = Field(default_factory=list)
    task_id: str | None = Field(default=None, description="Orchard: the Task.id this rollout attempted")
    rollout_key: str | None = Field(default=None, description="Orchard: key the gateway billed calls to")
    outcome: Outcome | None = Field(default=None, description="Orchard: None until graded")
    llm_calls: list[LLMCall] = Field(default_factory=list, description="Orchard: every model call")
    exit_status: ExitStatus | None = Field(
        default=None, description="Orchard: how the rollout ended (orchard.core.run_status); None until it did")
    partial: bool = Field(default=False, description="Orchard: the agent was cut off (timeout, crash, kill); "
                                                      "the steps are those recorded until then")
    phases: list[PhaseRecord] = Field(default_factory=list, description="Orchard: the trial's phases, timed")

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, version: str) -> str:
        if version not in SUPPORTED_ATIF_VERSIONS:
            raise ValueError(f"schema_version {version!r} is not supported; Orchard reads "
                             f"{SUPPORTED_ATIF_VERSIONS[0]} to {SUPPORTED_ATIF_VERSIONS[-1]}")
        return version

    @model_validator(mode="after")
    def _consistent(self) -> Trajectory:
        for index, step in enumerate(self.steps, start=1):
            if step.step_id != index:
                raise ValueError(f"step_id must run 1, 2, 3, ... in order; step #{index} has step_id "
                                 f"{step.step_id} (use next_step_id when appending)")
        call_ids = [call.id for call in self.llm_calls]
        if len(set(call_ids)) != len(call_ids):
            raise ValueError("llm_calls ids must be unique")
        known = set(call_ids)
        for step in self.steps:
            missing = [i for i in step.llm_call_ids if i not in known]
            if missing:
                raise ValueError(f"step {step.step_id} references llm call {missing[0]!r}, "
                                 "which is not in llm_calls")
        embedded = [sub.trajectory_id for sub in self.subagent_trajectories]
        if any(i is None for i in embedded) or len(set(embedded)) != len(embedded):
            raise ValueError("each embedded subagent trajectory needs a trajectory_id unique among its siblings")
        return self

    @property
    def next_step_id(self) -> int:
        return len(self.steps) + 1


def _check_iso8601(value: str | None) -> str | None:
    """Kept as the string given (lossless), but it must parse."""
    if value is not None:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 timestamp (e.g. 2025-10-16T14:30:00Z)") from None
    return value
