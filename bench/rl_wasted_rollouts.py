"""Measurement: BAR against DAPO's zero-variance filter given the same run memory, and fixed GRPO groups, at
an EQUAL ROLLOUT BUDGET (orchard.recipes.bar), on three figures: rollouts per informative (mixed-reward)
group, rollouts per trained rollout with signal (in an informative group: a nonzero advantage), and the
reward a simulated policy reaches on that budget.

- Simulated learning: a hard SWE set's U-shaped pass rates (half never solved, a tenth always, the rest
  Beta(0.5, 0.5)), 500 tasks, batches of 16 groups of G=8, each strategy run until it has spent the same
  rollout budget. The policy learns (orchard.recipes.bar.learning): after each step every trained rollout
  moves its task's logit by its advantage (baseline: all the task's rollouts of the step, as Orchard
  trains) times d log P(reward), averaged over the step's trained rollouts as TRL's loss does; the reward
  is the mean pass rate over the pool. BAR keeps its prompt history across steps; DAPO is shown with the
  same memory (the fair peer) and without (as published).
- Real: rewards of real swe-mini rollouts (react + a noisy oracle in real sandboxes, graded by the real
  grader). The noisy oracle plays the task's reference patch, or — with a per-task probability drawn from
  the same U shape — a wrong patch (a new notes file), so each task has its own pass rate. Each task's
  rollouts are run once into a pool; the allocators then draw from the pools (cycling, reshuffled), at an
  equal rollout budget: the rewards are real, their order is resampled."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Hashable
from dataclasses import dataclass

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from orchard.core.task import Task
from orchard.eval.suites import load_suite
from orchard.recipes.bar.config import BarConfig
from orchard.recipes.bar.learning import LearningRun, learning_run
from orchard.recipes.bar.simulation import RunTally, hard_swe_pass_rates, simulate_run

LEARNING_RATE = 8.0  # logit step per unit of mean advantage-weighted gradient (bar_learning's lr)
PEERS = {"dapo+memory": ("dapo", True), "fixed": ("fixed", None), "dapo": ("dapo", None)}
WRONG_PATCH = """diff --git a/ORCHARD_NOTES.md b/ORCHARD_NOTES.md
new file mode 100644
--- /dev/null
+++ b/ORCHARD_NOTES.md
@@ -0,0 +1 @@
+Looked at the issue; no fix yet.
"""


@dataclass
class Totals:
    """Several seeds' runs of one strategy, summed."""

    rollouts: int = 0
    informative_groups: int = 0
    signal_rollouts: int = 0
    gain: float = 0.0  # mean pass rate reached minus the initial one, summed over seeds
    half_gain: float = 0.0  # the same at half the budget
    runs: int = 0

    def add(self, tally: RunTally, run: LearningRun | None = None, budget: int = 0) -> None:
        self.rollouts += tally.rollouts
        self.informative_groups += tally.informative_groups
        self.signal_rollouts += tally.signal_rollouts
        self.runs += 1
        if run is not None:
            self.gain += run.final_reward - run.initial_reward
            self.half_gain += run.reward_at(budget // 2) - run.initial_reward

    @property
    def per_informative_group(self) -> float:
        return self.rollouts / self.informative_groups if self.informative_groups else math.inf

    @property
    def per_signal_rollout(self) -> float:
        return self.rollouts / self.signal_rollouts if self.signal_rollouts else math.inf


def simulated(ctx: BenchContext, budget: int, lr: float = LEARNING_RATE,
              config: BarConfig | None = None) -> tuple[dict[str, Totals], int]:
    seeds = ctx.pick(4, 1)
    config = config or BarConfig(group_size=8)
    totals: dict[str, Totals] = {}
    for seed in range(seeds):
        rates = hard_swe_pass_rates(500, seed=seed)
        for name, (strategy, memory) in {"bar": ("bar", None), **PEERS}.items():
            run = learning_run(strategy, rates, budget=budget, batch_groups=16, config=config, lr=lr, seed=seed,
                               memory=memory)
            totals.setdefault(name, Totals()).add(run.tally, run, budget)
    return totals, seeds


def noisy_oracle_pools(ctx: BenchContext) -> tuple[dict[str, list[float]], dict[str, float], int]:
    """Real rollouts: per task, `per_task` trials of react + the oracle, a wrong patch with the task's
    failure probability; returns the rewards (infrastructure errors left out, counted)."""
    from orchard.recipes.rl.env import RolloutEnv

    suite = load_suite("swe-mini")
    rng = random.Random(7)
    rates = dict(zip([t.id for t in suite.tasks], hard_swe_pass_rates(len(suite.tasks), seed=7).values()))
    per_task = ctx.pick(8, 2)
    plan: list[tuple[Task, bool]] = []
    for task in suite.tasks:
        for _ in range(per_task):
            plan.append((task, rng.random() < rates[task.id]))
    pools: dict[str, list[float]] = {task.id: [] for task in suite.tasks}
    errors = 0
    with RolloutEnv(None, model="oracle", parallel=4, harness_options={"step_limit": 6}) as env:
        async def run_all():
            return await asyncio.gather(*(env.arollout(task if solve else _wrong(task)) for task, solve in plan))

        for (task, _), trajectory in zip(plan, env.call(run_all())):
            outcome = trajectory.outcome
            if outcome is None or outcome.error is not None:
                errors += 1
                continue
            pools[task.id].append(1.0 if outcome.resolved else 0.0)
    return pools, rates, errors


def _wrong(task: Task) -> Task:
    grader = task.grader.model_copy(update={"reference_patch": WRONG_PATCH})
    return task.model_copy(update={"grader": grader})


def pool_sampler(pools: dict[str, list[float]], seed: int):
    rng = random.Random(seed)
    queues: dict[Hashable, list[float]] = {}

    def rollout(prompt_id: Hashable) -> float:
        queue = queues.get(prompt_id)
        if not queue:
            queue = list(pools[prompt_id])
            rng.shuffle(queue)
            queues[prompt_id] = queue
        return queue.pop()
    return rollout


def _figures(totals: dict[str, Totals], label: str, *, learning: bool, target: bool) -> list[Row]:
    bar = totals["bar"]
    peers = [name for name in totals if name != "bar"]

    def targets(on: str, op: str) -> list[Target]:
        return [Target(on=on, op=op, limit=1.0)] if target else []
    rows = [
        Row(metric=f"{label}: rollouts per informative group, BAR", unit="rollouts", ours=bar.per_informative_group,
            peers={name: totals[name].per_informative_group for name in peers},
            ratios={f"bar/{name}": ratio(bar.per_informative_group, totals[name].per_informative_group)
                    for name in peers},
            targets=targets("bar/dapo+memory", "<=")),
        Row(metric=f"{label}: rollouts per trained rollout with signal, BAR", unit="rollouts",
            ours=bar.per_signal_rollout, peers={name: totals[name].per_signal_rollout for name in peers},
            ratios={f"bar/{name}": ratio(bar.per_signal_rollout, totals[name].per_signal_rollout)
                    for name in peers},
            targets=targets("bar/dapo+memory", "<=")),
    ]
    if learning:
        gain = {name: t.gain / t.runs for name, t in totals.items()}
        rows.append(Row(metric=f"{label}: mean pass rate gained on the budget, BAR", unit="points",
                        ours=100 * gain["bar"], peers={name: 100 * gain[name] for name in peers},
                        ratios={f"bar/{name}": ratio(gain["bar"], gain[name]) for name in peers},
                        targets=[Target(on="bar/dapo+memory", op=">=", limit=1.0)] if target else []))
    return rows


def _sensitivity(fast: dict[str, Totals], pairs_only: dict[str, Totals]) -> str:
    def gain(totals: dict[str, Totals]) -> float:
        return ratio(totals["bar"].gain, totals["dapo+memory"].gain)  # same number of runs each

    def spent(totals: dict[str, Totals], figure: str) -> float:
        return ratio(getattr(totals["bar"], figure), getattr(totals["dapo+memory"], figure))
    fast_gain = gain(fast)
    why = (" (a policy that learns fast brings tasks into reach that BAR retired for the run after 5 failures; "
           "DAPO retires after 8)" if fast_gain < 1 else "")
    return (f"Sensitivity, against DAPO+memory: at a learning rate 4× larger BAR's gain is {fast_gain:.2f}×{why}, "
            f"at {spent(fast, 'per_informative_group'):.2f}× the rollouts per informative group. With balanced "
            f"pairs only (fill_group=False, the old default) BAR spends "
            f"{spent(pairs_only, 'per_signal_rollout'):.2f}× the rollouts per trained rollout (it drops the "
            f"surplus of the commoner reward) and gains {gain(pairs_only):.2f}× (TRL's loss averages over fewer "
            "trained tokens: a larger step per rollout).")


def where_bar_loses(rows: list[Row]) -> str:
    """Every figure on which BAR does worse than DAPO given the same memory, said plainly."""
    losses = []
    for row in rows:
        value = row.ratios.get("bar/dapo+memory")
        if value is None:
            continue
        worse = value < 1 if "gained" in row.metric else value > 1
        if worse:
            losses.append(f"{row.metric.replace(', BAR', '')} ({value:.2f}× DAPO+memory's)")
    if not losses:
        return "BAR does as well as or better than DAPO+memory on every figure above."
    return "Where BAR does not win: " + "; ".join(losses) + "."


def run(ctx: BenchContext) -> Findings:
    budget = ctx.pick(8192, 2048)
    totals, seeds = simulated(ctx, budget)
    initial = statistics.fmean(statistics.fmean(hard_swe_pass_rates(500, seed=s).values()) for s in range(seeds))
    rows = _figures(totals, "simulated U shape, equal budget", learning=True, target=True)
    fast, _ = simulated(ctx, budget, lr=4 * LEARNING_RATE)
    pairs_only, _ = simulated(ctx, budget, config=BarConfig(group_size=8, fill_group=False))
    pools, rates, errors = noisy_oracle_pools(ctx)
    usable = {task_id: rewards for task_id, rewards in pools.items() if rewards}
    config = BarConfig(group_size=4)
    real_budget = ctx.pick(400, 120)
    real: dict[str, Totals] = {}
    for seed in range(ctx.pick(5, 2)):  # orders resampled from the same real pools
        for name, (strategy, memory) in {"bar": ("bar", None), **PEERS}.items():
            tally = simulate_run(strategy, list(usable), pool_sampler(usable, seed=seed), steps=real_budget,
                                 batch_groups=2, config=config, seed=seed, memory=memory, budget=real_budget)
            real.setdefault(name, Totals()).add(tally)
    rows += _figures(real, "real swe-mini rewards (noisy oracle), equal budget", learning=False, target=False)
    pooled = sum(len(v) for v in pools.values())
    observed = {task_id: sum(v) / len(v) for task_id, v in usable.items()}
    notes = [
        f"Simulated: {seeds} seed(s) × 500 tasks, batches of 16 groups of G=8, {budget} rollouts per run for "
        f"every strategy (a run stops before the step that would pass the budget). BAR's defaults: first "
        "round 2, rounds ≤ 4, retired after 5 agreeing rollouts, ≤ G rollouts per task per step, a group out "
        f"of budget filled up to G (Reinforce-Ada's fallback). Learning rate {LEARNING_RATE:g}. A trained "
        "rollout with signal is one in an informative group; fixed GRPO also trains its zero-variance groups, "
        f"with advantage 0. Initial mean pass rate {100 * initial:.1f}%.",
        "Learning curve (mean pass rate gained, points, at half the budget → the whole budget): "
        + "; ".join(f"{name} {100 * t.half_gain / t.runs:.2f} → {100 * t.gain / t.runs:.2f}"
                    for name, t in totals.items()) + ".",
        _sensitivity(fast, pairs_only),
        f"Real: {pooled} graded rollouts of react + the noisy oracle on the {len(pools)} swe-mini tasks "
        f"({errors} infrastructure errors left out); observed pass rates "
        f"{', '.join(f'{v:.2f}' for v in sorted(observed.values()))}. Allocators draw from those pools "
        f"(G=4, 2 groups per step, {real_budget} rollouts per run, 5 orders; BAR's defaults). With so few tasks "
        "that have signal, a run can retire them all by bad luck (then it stops early: "
        "`PromptHistory.revive` is the remedy).",
    ]
    notes.insert(0, where_bar_loses(rows))
    return Findings(rows=rows, notes=notes)


MEASUREMENT = Measurement(
    name="rl_wasted_rollouts",
    title="RL: BAR vs DAPO with memory vs GRPO at an equal rollout budget",
    method=" ".join(__doc__.split("\n\n", 1)[1].split()),
    run=run,
)
