"""Trajectories -> training examples of exactly what the policy saw and produced.

Each recorded `LLMCall` of a trajectory becomes one example: its request (messages + tools) rendered with the
student's chat template as the prompt (labels -100, weight 0), its response as the completion (orchard.recipes
.call_render). Where the gateway recorded token ids, those ids are the example, as they were sampled (token in,
token out, as the RL samples are), once they are shown to be the student's: the recorded prompt decodes to the
prompt the student's template renders (or, with no prompt recorded, the completion to the rendered completion).
A sampler may tokenize a text otherwise than re-tokenizing it does (`[' timestamp', 'e']` against
`[' timest', 'am', 'pe']`): the recorded ids are trained and the call counted in `BuildReport.kept`. Ids that
decode to other text (another tokenizer or template) are reported as a `TokenMismatch` and left out.

A call cut off by its token limit (`finish_reason` 'length') has no end-of-turn token: it is trained as it was
sampled, without one (`kept['truncated']`), or left out with `filters.truncated: skip`.

What is trained:
- a rollout that ended in an error (`outcome.error`) never is: the attempt did not happen properly;
- calls of steps flagged `is_copied_context` never are;
- resolved rollouts: every call, weight 1.0 (or the step's weight in `step_weights`, when named there);
- other rollouts (failed or ungraded): with `filters.resolved_only` (the default) only the steps
  `step_weights[rollout_key]` names, with their weight (credit assignment on failed rollouts); without it,
  every call, weight 1.0 unless named (plain distillation of a teacher's rollouts, whatever their outcome).

`BuildReport.skipped` counts the calls not trained, by reason (`SKIP_REASONS`). Embedded subagent
trajectories (`Trajectory.subagent_trajectories`) are not read: pass them as trajectories of their own."""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchard.core.trajectory import LLMCall, Step, Trajectory
from orchard.recipes.common.call_render import RenderedCall, RenderError, render_call, response_message

IGNORE_INDEX = -100  # the label of a token that is not trained (PyTorch's cross-entropy ignore_index)
EXCERPT_CHARS = 80

SKIP_REASONS = {
    "error_outcome": "the rollout ended in an error (model, sandbox, grader...): not an attempt",
    "unresolved": "the rollout is not resolved and step_weights does not name this step",
    "harness_filtered": "the rollout's harness is not among filters.harnesses",
    "model_filtered": "the rollout's model is not among filters.models",
    "copied_context": "the step repeats an earlier context (is_copied_context)",
    "zero_weight": "step_weights gives this step weight 0",
    "call_failed": "the call failed or has no response",
    "no_request": "the call's request messages were not recorded",
    "render_failed": "the student's chat template cannot render the call",
    "token_mismatch": "the recorded token ids decode to other text than the re-rendered call (see mismatches)",
    "truncated": "cut off by the token limit (finish_reason 'length') and filters.truncated is skip",
    "too_long": "longer than filters.max_length",
    "duplicate": "the same tokens and labels as an earlier example",
}


class ExampleFilters(BaseModel):
    """Which rollouts and calls become examples."""

    model_config = ConfigDict(extra="forbid")

    resolved_only: bool = Field(default=True, description=(
        "train unresolved (failed or ungraded) rollouts only on the steps step_weights names; False trains "
        "every call of them with weight 1.0"))
    harnesses: list[str] | None = Field(default=None, description="keep only rollouts of these harnesses")
    models: list[str] | None = Field(default=None, description="keep only rollouts of these models "
                                                                "(the trajectory's agent.model_name)")
    max_length: int | None = Field(default=None, gt=0, description="leave out examples longer (prompt + "
                                                                   "completion tokens); never truncated")
    dedup: bool = Field(default=True, description="leave out examples whose tokens and labels repeat an "
                                                  "earlier one")
    truncated: Literal["train", "skip"] = Field(default="train", description=(
        "a call cut off by its token limit: train it as sampled, with no end-of-turn token, or skip it"))

KEPT_REASONS = {
    "recorded_ids": "trained on the recorded ids, which re-tokenizing the same text does not reproduce",
    "truncated": "cut off by the token limit: trained as sampled, with no end-of-turn token",
}


class ExampleSource(BaseModel):
    """Where an example comes from."""

    rollout_key: str | None
    task_id: str | None
    harness: str
    model: str | None
    step_id: int | None = Field(description="the agent step the call produced; None for a call of no step")
    llm_call_id: str


class TrainingExample(BaseModel):
    """One call as training data: `labels` is `input_ids` on completion tokens and -100 on prompt tokens;
    `token_weights` scales each token's loss (0 on the prompt)."""

    input_ids: list[int]
    labels: list[int]
    token_weights: list[float]
    source: ExampleSource
    token_ids_recorded: bool = Field(default=False, description="the ids are the gateway's record, checked "
                                                                "against re-rendering")

    @model_validator(mode="after")
    def _aligned(self) -> TrainingExample:
        if not len(self.input_ids) == len(self.labels) == len(self.token_weights):
            raise ValueError("input_ids, labels and token_weights must have one entry per token")
        if any(label != IGNORE_INDEX and label != token for label, token in zip(self.labels, self.input_ids)):
            raise ValueError("a label must be its token's id or -100")
        return self

    @property
    def trained_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)

    def row(self) -> dict[str, Any]:
        """The dataset row the trainer reads."""
        return {"input_ids": self.input_ids, "labels": self.labels, "token_weights": self.token_weights}


class TokenMismatch(BaseModel):
    """Recorded token ids that re-rendering the call with the student's tokenizer does not reproduce."""

    source: ExampleSource
    part: Literal["prompt", "completion"]
    index: int = Field(description="the first token position where they differ")
    recorded_tokens: int
    rendered_tokens: int
    recorded_excerpt: str = Field(description="the recorded tokens from that position, decoded")
    rendered_excerpt: str = Field(description="the re-rendered tokens from that position, decoded")
    finish_reason: str | None = Field(default=None, description="why the call's generation ended ('length': cut "
                                                                "off by max_tokens, before its end of turn)")


class BuildReport(BaseModel):
    examples: list[TrainingExample] = Field(default_factory=list)
    mismatches: list[TokenMismatch] = Field(default_factory=list)
    skipped: dict[str, int] = Field(default_factory=dict, description="calls not trained, by reason "
                                                                      "(SKIP_REASONS)")
    kept: dict[str, int] = Field(default_factory=dict, description="calls trained otherwise than re-rendering "
                                                                   "gives, by reason (KEPT_REASONS)")
    trajectories: int = 0
    calls: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(example.trained_tokens for example in self.examples)

    def summary(self) -> str:
        skipped = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items())) or "none"
        kept = "".join(f", {count} {reason}" for reason, count in sorted(self.kept.items()) if count)
        return (f"{len(self.examples)} examples ({self.trained_tokens} trained tokens) from {self.calls} calls "
                f"of {self.trajectories} trajectories; skipped: {skipped}"
                + (f"; trained as recorded: {kept[2:]}" if kept else ""))


def build_examples(trajectories: Iterable[Trajectory], tokenizer: Any, *, filters: ExampleFilters | None = None,
                   step_weights: Mapping[str, Mapping[int, float]] | None = None) -> BuildReport:
    """Training examples from `trajectories` for a student with `tokenizer` (see the module docstring).
    `step_weights` maps rollout_key -> agent step_id -> the weight of that step's completion tokens."""
    filters = filters or ExampleFilters()
    step_weights = step_weights or {}
    report = BuildReport()
    skipped: Counter[str] = Counter()
    seen: set[bytes] = set()
    for trajectory in trajectories:
        report.trajectories += 1
        report.calls += len(trajectory.llm_calls)
        reason = _rollout_skip_reason(trajectory, filters)
        if reason:
            skipped[reason] += len(trajectory.llm_calls)
            continue
        named = step_weights.get(trajectory.rollout_key or "", {})
        steps = _steps_by_call(trajectory)
        for call in trajectory.llm_calls:
            step = steps.get(call.id)
            weight, reason = _call_weight(trajectory, step, named, filters)
            notes: list[str] = []
            if reason is None:
                example, reason, notes = _example(trajectory, step, call, weight, tokenizer, report, filters)
            if reason is None and filters.max_length is not None and len(example.input_ids) > filters.max_length:
                reason = "too_long"
            if reason is None and filters.dedup:
                key = _dedup_key(example)
                reason = "duplicate" if key in seen else None
                seen.add(key)
            if reason is None:
                report.examples.append(example)
                for note in notes:
                    report.kept[note] = report.kept.get(note, 0) + 1
            else:
                skipped[reason] += 1
    report.skipped = dict(sorted(skipped.items()))
    report.kept = dict(sorted(report.kept.items()))
    return report


def _rollout_skip_reason(trajectory: Trajectory, filters: ExampleFilters) -> str | None:
    if trajectory.outcome is not None and trajectory.outcome.error is not None:
        return "error_outcome"
    if filters.harnesses is not None and trajectory.agent.name not in filters.harnesses:
        return "harness_filtered"
    if filters.models is not None and trajectory.agent.model_name not in filters.models:
        return "model_filtered"
    return None


def _steps_by_call(trajectory: Trajectory) -> dict[str, Step]:
    steps: dict[str, Step] = {}
    for step in trajectory.steps:
        for call_id in step.llm_call_ids:
            steps.setdefault(call_id, step)
    return steps


def _call_weight(trajectory: Trajectory, step: Step | None, named: Mapping[int, float],
                 filters: ExampleFilters) -> tuple[float, str | None]:
    if step is not None and step.is_copied_context:
        return 0.0, "copied_context"
    weight = named.get(step.step_id) if step is not None else None
    if weight is None:
        resolved = trajectory.outcome is not None and bool(trajectory.outcome.resolved)
        if not resolved and filters.resolved_only:
            return 0.0, "unresolved"
        weight = 1.0
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"step_weights[{trajectory.rollout_key!r}][{step.step_id}] is {weight}; a step's "
                         "weight must be a finite number >= 0")
    return float(weight), ("zero_weight" if weight == 0 else None)


def _example(trajectory: Trajectory, step: Step | None, call: LLMCall, weight: float, tokenizer: Any,
             report: BuildReport, filters: ExampleFilters) -> tuple[TrainingExample | None, str | None, list[str]]:
    response = response_message(call.response)
    if call.error is not None or response is None:
        return None, "call_failed", []
    if not call.request_messages:
        return None, "no_request", []
    truncated = _finish_reason(call.response) == "length"
    if truncated and filters.truncated == "skip":
        return None, "truncated", []
    source = ExampleSource(rollout_key=trajectory.rollout_key, task_id=trajectory.task_id,
                           harness=trajectory.agent.name, model=call.model or trajectory.agent.model_name,
                           step_id=step.step_id if step is not None else None, llm_call_id=call.id)
    try:
        rendered = render_call(tokenizer, call.request_messages, call.request_params.get("tools"), response)
    except RenderError:
        return None, "render_failed", []
    prompt, completion = rendered.prompt_ids, rendered.completion_ids
    notes = ["truncated"] if truncated else []
    if truncated:  # the template closes the turn; the sampler never wrote that end-of-turn token
        completion = _without_end_of_turn(tokenizer, completion)
    recorded = call.prompt_token_ids is not None or call.completion_token_ids is not None
    if recorded:
        mismatch = _mismatch(tokenizer, source, rendered, call, truncated)
        if mismatch is not None:
            report.mismatches.append(mismatch)
            return None, "token_mismatch", []
        recorded_prompt = call.prompt_token_ids if call.prompt_token_ids is not None else prompt
        recorded_completion = call.completion_token_ids if call.completion_token_ids is not None else completion
        if (list(recorded_prompt), list(recorded_completion)) != (prompt, completion):
            notes.append("recorded_ids")
        prompt, completion = list(recorded_prompt), list(recorded_completion)
    if not completion:
        return None, "call_failed", []
    return TrainingExample(input_ids=[*prompt, *completion], labels=[IGNORE_INDEX] * len(prompt) + list(completion),
                           token_weights=[0.0] * len(prompt) + [weight] * len(completion), source=source,
                           token_ids_recorded=recorded), None, notes


def _without_end_of_turn(tokenizer: Any, ids: list[int]) -> list[int]:
    end = getattr(tokenizer, "eos_token_id", None)
    return ids[:-1] if ids and end is not None and ids[-1] == end else ids


def _decoded(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _mismatch(tokenizer: Any, source: ExampleSource, rendered: RenderedCall, call: LLMCall,
              truncated: bool) -> TokenMismatch | None:
    """The first recorded part that is not the student's tokens for this call: the recorded prompt must
    decode to the rendered prompt; the recorded completion is then the student's own sampling, trained as it
    is. With no prompt recorded, the completion must decode to the rendered completion (without its end of
    turn when the call was cut off)."""
    if call.prompt_token_ids is not None:
        if list(call.prompt_token_ids) == rendered.prompt_ids \
                or _decoded(tokenizer, call.prompt_token_ids) == rendered.prompt_text:
            return None
        return _mismatch_record(tokenizer, source, "prompt", call.prompt_token_ids, rendered.prompt_ids, call)
    if call.completion_token_ids is None:
        return None
    expected_ids = _without_end_of_turn(tokenizer, rendered.completion_ids) if truncated else rendered.completion_ids
    if list(call.completion_token_ids) == expected_ids \
            or _decoded(tokenizer, call.completion_token_ids) == _decoded(tokenizer, expected_ids):
        return None
    return _mismatch_record(tokenizer, source, "completion", call.completion_token_ids, expected_ids, call)


def _mismatch_record(tokenizer: Any, source: ExampleSource, part: Literal["prompt", "completion"],
                     recorded: list[int], ids: list[int], call: LLMCall) -> TokenMismatch:
    index = next((i for i, (a, b) in enumerate(zip(recorded, ids)) if a != b), min(len(recorded), len(ids)))
    return TokenMismatch(
        source=source, part=part, index=index, recorded_tokens=len(recorded), rendered_tokens=len(ids),
        recorded_excerpt=tokenizer.decode(recorded[index:index + 40])[:EXCERPT_CHARS],
        rendered_excerpt=tokenizer.decode(ids[index:index + 40])[:EXCERPT_CHARS],
        finish_reason=_finish_reason(call.response))


def _finish_reason(response: dict[str, Any] | None) -> str | None:
    choices = (response or {}).get("choices") or [{}]
    reason = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
    return reason if isinstance(reason, str) else None


def _dedup_key(example: TrainingExample) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((example.input_ids, example.labels)).encode())
    return digest.digest()
