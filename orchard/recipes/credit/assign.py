"""Credit-assignment SFT: learn from failed SWE rollouts too, on the steps that made progress.

For each failed rollout (graded, not resolved, no error) of a task with a reference patch:
1. hindsight values per agent step from the proxies (proxies.py: gold files opened, diff overlap
   with the gold patch, FAIL_TO_PASS tests passing on the replayed prefix) and optionally an LLM judge
   (judge.py), mixed with `CreditSettings.proxy_weights`;
2. smoothed, Δ per step, ascent segments before the value peak, weights ∝ Δ, never a submitting step
   (values.py);
3. `step_weights[rollout_key][step_id] = weight`: the interface of
   `orchard.recipes.common.examples.build_examples`, where resolved rollouts train at 1.0 and failed ones only on
   the steps named.

`build_credit_examples` then builds the examples and caps the failure-derived share of trained tokens
(`max_failure_share`, default 30%): when over, the lowest-weight failure steps are dropped until under.
`CreditReport` says what each rollout was valued at, and how many tokens were recovered from failures and
from which steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from orchard.core.dialect import harness_dialect
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory
from orchard.recipes.credit.judge import JudgeConfig, judge_values
from orchard.recipes.credit.proxies import agent_steps, is_submit, sandbox_proxies
from orchard.recipes.credit.values import (CreditSettings, ascent_segments, deltas, mix, peak_index, segment_weights,
                                           smooth)
from orchard.recipes.common.examples import BuildReport, ExampleFilters, build_examples
from orchard.sandbox.client import AsyncOrchard

StepWeights = dict[str, dict[int, float]]


class StepCredit(BaseModel):
    step_id: int
    value: float = Field(description="the mixed hindsight value after this step")
    smoothed: float
    delta: float
    weight: float = Field(default=0.0, description="its completion tokens' weight; 0 = not trained")
    submits: bool = False


class RolloutCredit(BaseModel):
    rollout_key: str
    task_id: str | None
    harness: str
    proxies: dict[str, list[float]] = Field(default_factory=dict, description="each proxy's values, per step")
    steps: list[StepCredit] = Field(default_factory=list)
    segments: list[tuple[int, int, float]] = Field(default_factory=list, description="(first step_id, last "
                                                                                     "step_id, gain)")
    peak_step_id: int | None = None
    test_runs: int = 0
    replay_matches_record: bool | None = Field(default=None, description=(
        "the replay ended with the diff the run was graded on; False: the commands did not reproduce it "
        "(nondeterministic commands, time, network), so the values are those of the replay"))
    error: str | None = Field(default=None, description="why no values could be computed")

    @property
    def step_weights(self) -> dict[int, float]:
        return {step.step_id: step.weight for step in self.steps if step.weight > 0}


class RecoveredStep(BaseModel):
    rollout_key: str
    step_id: int
    weight: float
    tokens: int


class CreditReport(BaseModel):
    settings: CreditSettings
    rollouts: list[RolloutCredit] = Field(default_factory=list)
    recovered: list[RecoveredStep] = Field(default_factory=list, description="failure steps trained")
    dropped_by_cap: list[RecoveredStep] = Field(default_factory=list)
    failure_tokens: int = 0
    resolved_tokens: int = 0

    @property
    def step_weights(self) -> StepWeights:
        weights: StepWeights = {}
        for step in self.recovered:
            weights.setdefault(step.rollout_key, {})[step.step_id] = step.weight
        return weights

    def summary(self) -> str:
        total = self.failure_tokens + self.resolved_tokens
        share = self.failure_tokens / total if total else 0.0
        errors = sum(1 for r in self.rollouts if r.error)
        return (f"credit assignment: {len(self.rollouts)} failed rollouts valued ({errors} without values), "
                f"{len(self.recovered)} steps recovered: {self.failure_tokens} tokens from failures, "
                f"{self.resolved_tokens} from resolved rollouts ({share:.0%} from failures, cap "
                f"{self.settings.max_failure_share:.0%}; {len(self.dropped_by_cap)} steps dropped by the cap)")


def credit_from_values(trajectory: Trajectory, proxies: Mapping[str, Sequence[float]], settings: CreditSettings,
                       *, start_value: float = 0.0) -> RolloutCredit:
    """Smoothing, Δ, ascent segments and weights for one rollout whose per-step proxy values are known."""
    steps = agent_steps(trajectory)
    values = mix({k: list(v) for k, v in proxies.items()}, settings.proxy_weights)
    smoothed = smooth(values, settings.smoothing)
    steps_delta = deltas(smoothed, start_value)
    peak = peak_index(smoothed)
    segments = ascent_segments(steps_delta, peak, min_delta=settings.min_delta, min_gain=settings.min_gain)
    dialect = harness_dialect(trajectory.agent.name)
    submits = [is_submit(dialect, step) for step in steps]
    weights = segment_weights(steps_delta, segments, submits, settings)
    return RolloutCredit(
        rollout_key=trajectory.rollout_key or "", task_id=trajectory.task_id, harness=trajectory.agent.name,
        proxies={k: list(v) for k, v in proxies.items()},
        steps=[StepCredit(step_id=step.step_id, value=values[i], smoothed=smoothed[i], delta=steps_delta[i],
                          weight=weights.get(i, 0.0), submits=submits[i]) for i, step in enumerate(steps)],
        segments=[(steps[s.start].step_id, steps[s.end].step_id, s.gain) for s in segments],
        peak_step_id=steps[peak].step_id if peak >= 0 else None)


def is_failed(trajectory: Trajectory) -> bool:
    outcome = trajectory.outcome
    return outcome is not None and outcome.error is None and outcome.resolved is False


async def assign_credit(trajectories: Iterable[Trajectory], tasks: Mapping[str, Task], orch: AsyncOrchard,
                        settings: CreditSettings | None = None, *, judge: JudgeConfig | None = None) -> CreditReport:
    """Values and step weights for every failed rollout among `trajectories` whose task is in `tasks`
    (others are left alone). A rollout whose values cannot be computed (no reference patch, an
    untranslatable harness, a failing sandbox) is reported with its error and trains nothing."""
    settings = settings or CreditSettings()
    report = CreditReport(settings=settings)
    for trajectory in trajectories:
        if not is_failed(trajectory) or not trajectory.rollout_key:
            continue
        task = tasks.get(trajectory.task_id or "")
        try:
            if task is None:
                raise ValueError(f"task {trajectory.task_id!r} is not in the suite given")
            proxies = await sandbox_proxies(orch, task, trajectory, run_tests=settings.run_tests,
                                            max_test_runs=settings.max_test_runs)
            values = dict(proxies.values)
            if judge is not None:
                values["judge"] = await judge_values(trajectory, task, judge)
            credit = credit_from_values(trajectory, values, settings)
            credit.test_runs, credit.replay_matches_record = proxies.test_runs, proxies.replay_matches_record
        except Exception as exc:  # one rollout's failure never stops the others
            credit = RolloutCredit(rollout_key=trajectory.rollout_key, task_id=trajectory.task_id,
                                   harness=trajectory.agent.name, error=f"{type(exc).__name__}: {exc}")
        report.rollouts.append(credit)
    return report


def build_credit_examples(trajectories: Sequence[Trajectory], tokenizer: Any, credit: CreditReport, *,
                          filters: ExampleFilters | None = None) -> BuildReport:
    """The training examples with the credited failure steps, capped to `max_failure_share` of the trained
    tokens. Fills `credit.recovered`, `dropped_by_cap` and the token counts."""
    wanted: StepWeights = {r.rollout_key: r.step_weights for r in credit.rollouts if r.step_weights}
    first = build_examples(trajectories, tokenizer, filters=filters, step_weights=wanted)
    tokens: dict[tuple[str, int], int] = {}
    resolved_tokens = 0
    for example in first.examples:
        key = example.source.rollout_key or ""
        if key in wanted and example.source.step_id in wanted[key]:
            step = (key, example.source.step_id)
            tokens[step] = tokens.get(step, 0) + example.trained_tokens
        else:
            resolved_tokens += example.trained_tokens
    steps = [RecoveredStep(rollout_key=key, step_id=step_id, weight=wanted[key][step_id], tokens=count)
             for (key, step_id), count in tokens.items()]
    kept, dropped = cap_failure_steps(steps, resolved_tokens, credit.settings.max_failure_share)
    credit.recovered, credit.dropped_by_cap = kept, dropped
    credit.failure_tokens, credit.resolved_tokens = sum(s.tokens for s in kept), resolved_tokens
    if not dropped:
        return first
    return build_examples(trajectories, tokenizer, filters=filters, step_weights=credit.step_weights)


def cap_failure_steps(steps: Sequence[RecoveredStep], resolved_tokens: int,
                      share: float) -> tuple[list[RecoveredStep], list[RecoveredStep]]:
    """Keep failure steps, best weight first, while their tokens stay within `share` of all trained tokens:
    F <= share * (F + resolved_tokens)."""
    if share >= 1:
        return list(steps), []
    limit = share / (1 - share) * resolved_tokens
    kept, dropped, total = [], [], 0
    for step in sorted(steps, key=lambda s: (-s.weight, s.rollout_key, s.step_id)):
        if total + step.tokens <= limit:
            kept.append(step)
            total += step.tokens
        else:
            dropped.append(step)
    order = lambda s: (s.rollout_key, s.step_id)  # noqa: E731
    return sorted(kept, key=order), sorted(dropped, key=order)
