"""Measurement: where an RL step's time goes — rollouts (real trials: sandbox, react, the policy's
generation through the gateway, grading) vs training (TRL GRPOTrainer's forward/backward/optimizer step) —
with 1 and 4 rollouts (sandboxes) at once.

One GRPO step of `orchard train rl` with the tiny random Qwen3 (hidden 32, 2 layers) as the policy, 2
swe-mini tasks × G=4 rollouts, fixed groups (8 rollouts, so both settings run the same work), react with
at most 3 model calls of at most 32 tokens each. A tiny policy keeps generation cheap, so the split shows
the environment's share; a real policy's generation adds to the rollout side."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, ratio

TASKS = ["orchard__pagekit-112", "orchard__csvlite-23"]


def one_step(parallel: int, generations: int) -> tuple[float, float, int]:
    """(rollout seconds, training seconds, rollouts) of one step."""
    import torch

    from orchard.recipes.rl.train import RLConfig, train_rl

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-rl-") as out:
        result = train_rl(RLConfig(out=Path(out), tasks=TASKS, num_generations=generations, tasks_per_step=2,
                                   max_steps=1, strategy="fixed", parallel=parallel, max_tokens=32,
                                   harness_options={"step_limit": 3}))
    (report,) = result.reports
    return result.rollout_s, result.train_s, report["rollouts"]


def run(ctx: BenchContext) -> Findings:
    generations = ctx.pick(4, 2)
    figures = {parallel: one_step(parallel, generations) for parallel in (1, 4)}
    rows = []
    for parallel, (rollout_s, train_s, rollouts) in figures.items():
        rows.append(Row(metric=f"--parallel {parallel}: rollouts ({rollouts}) per step", unit="s", ours=rollout_s,
                        peers={"training": train_s},
                        ratios={"rollout share": ratio(rollout_s, rollout_s + train_s)}))
    rows.append(Row(metric="rollout time, --parallel 1 / --parallel 4", unit="×",
                    ours=ratio(figures[1][0], figures[4][0])))
    return Findings(rows=rows, notes=[
        "Generation is one call at a time in-process (the policy is one model on the CPU); parallel "
        "rollouts overlap only the sandboxes, the harness's tools and grading around it, which gains little "
        f"on a machine with {os.cpu_count()} cores already busy. Training is TRL's whole GRPO step on the "
        "tiny model (logprobs of every completion token, backward, optimizer) over the 8 rollouts' ~1.2k "
        "tokens each; both figures move with the machine's load (see the load average above)."])


MEASUREMENT = Measurement(
    name="rl_step_time",
    title="RL: step time, rollouts vs training (1 and 4 sandboxes at once)",
    method=" ".join(__doc__.split("\n\n", 1)[1].split()),
    run=run,
)
