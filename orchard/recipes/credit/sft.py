"""The data side of `orchard train sft --target-harness B --credit-assignment`: trajectories -> (optionally)
hindsight credit on the failed ones -> (optionally) translated into harness B -> training examples with the
credited steps weighted and the failure-derived share capped. Returns the examples as `run_sft` takes them
(`report=`) and the credit report, written beside the run's metrics as `credit_report.json`.

Credit is computed on the rollouts as recorded (their replay uses their own harness's tools); a translated
rollout keeps it: its steps name the source steps they come from (`extra["translated_from_step"]`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.core.dialect import harness_dialect
from orchard.core.trajectory import Trajectory
from orchard.recipes.common.examples import BuildReport, ExampleFilters, build_examples
from orchard.recipes.credit.assign import CreditReport, RolloutCredit, StepCredit, assign_credit, build_credit_examples
from orchard.recipes.credit.judge import JudgeConfig
from orchard.recipes.credit.values import CreditSettings
from orchard.recipes.translate.trajectory import translate_all

CREDIT_REPORT_FILE = "credit_report.json"


@dataclass
class PreparedData:
    report: BuildReport
    credit: CreditReport | None = None
    untranslated: dict[str, str] = field(default_factory=dict)  # rollout key -> why it was left out

    def summary(self) -> str:
        lines = []
        if self.untranslated:
            lines.append(f"{len(self.untranslated)} rollouts could not be translated and were left out")
        if self.credit is not None:
            lines.append(self.credit.summary())
        return "; ".join(lines)


def prepare_examples(trajectories: Sequence[Trajectory], tokenizer: Any, *, filters: ExampleFilters | None = None,
                     target_harness: str | None = None, credit: CreditSettings | None = None,
                     suite: str = "swe-mini", judge: JudgeConfig | None = None, orchard_home: Path | None = None,
                     out: Path | None = None) -> PreparedData:
    """See the module docstring. `suite` names the tasks the rollouts attempted (for their reference
    patches and tests); sandboxes are embedded (AsyncOrchard with `orchard_home`)."""
    credit_report = None
    if credit is not None:
        credit_report = asyncio.run(_assign(trajectories, credit, suite, judge, orchard_home))
    untranslated: dict[str, str] = {}
    if target_harness is not None:
        asyncio.run(_capture_prompts(trajectories, target_harness, suite, orchard_home))
        translated, untranslated = translate_all(trajectories, target_harness)
        if credit_report is not None:
            remap_credit(credit_report, translated, target_harness)
        trajectories = translated
    if credit_report is not None:
        report = build_credit_examples(trajectories, tokenizer, credit_report, filters=filters)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / CREDIT_REPORT_FILE).write_text(credit_report.model_dump_json(indent=2))
    else:
        report = build_examples(trajectories, tokenizer, filters=filters)
    return PreparedData(report=report, credit=credit_report, untranslated=untranslated)


async def _capture_prompts(trajectories: Sequence[Trajectory], target: str, suite: str, home: Path | None) -> None:
    """A harness that renders its own prompts (Kimi-CLI, OpenHands: `Dialect.captures_prompt`) is run once per
    task not captured yet (orchard.recipes.translate.captured)."""
    from orchard.recipes.translate.captured import capture_prompts

    task_ids = sorted({t.task_id for t in trajectories if t.task_id and t.agent.name != target})
    if task_ids and harness_dialect(target).captures_prompt:  # the harness runs in sandboxes of $ORCHARD_HOME
        await capture_prompts(target, task_ids, suite=suite, home=home)


async def _assign(trajectories: Sequence[Trajectory], settings: CreditSettings, suite: str,
                  judge: JudgeConfig | None, home: Path | None) -> CreditReport:
    from orchard.eval.suites import load_suite
    from orchard.sandbox.client import AsyncOrchard

    tasks = {task.id: task for task in load_suite(suite).tasks}
    async with AsyncOrchard(home=home) as orchard:
        return await assign_credit(trajectories, tasks, orchard, settings, judge=judge)


def remap_credit(report: CreditReport, translated: Sequence[Trajectory], target: str) -> None:
    """Point each rollout's credit at its translation: key `KEY@target`, steps by `translated_from_step`."""
    by_source: dict[str, Trajectory] = {}
    for trajectory in translated:
        if trajectory.rollout_key and trajectory.rollout_key.endswith(f"@{target}"):
            by_source[trajectory.rollout_key.removesuffix(f"@{target}")] = trajectory
    remapped: list[RolloutCredit] = []
    for rollout in report.rollouts:
        trajectory = by_source.get(rollout.rollout_key)
        if trajectory is None:  # already in the target harness, or left out
            remapped.append(rollout)
            continue
        new_ids = {step.extra.get("translated_from_step"): step.step_id for step in trajectory.steps
                   if step.source == "agent"}
        steps = [StepCredit(**{**step.model_dump(), "step_id": new_ids[step.step_id]})
                 for step in rollout.steps if step.step_id in new_ids]
        segments = [(new_ids[first], new_ids[last], gain) for first, last, gain in rollout.segments
                    if first in new_ids and last in new_ids]
        remapped.append(rollout.model_copy(update={
            "rollout_key": trajectory.rollout_key, "harness": target, "steps": steps, "segments": segments,
            "peak_step_id": new_ids.get(rollout.peak_step_id)}))
    report.rollouts = remapped
