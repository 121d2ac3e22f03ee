"""What the in-sandbox harness measurements (kimi_cli, openhands) share: one oracle rollout of a harness as
`orchard eval` runs it, timed by phase; commands timed in one sandbox with the harness's bundle mounted; and
the rows comparing a harness's rollouts with in-process `react`'s."""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.measurement import BenchContext
from bench.results_model import Row, ratio
from bench.stats import LatencyStats
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.jsonl import read_jsonl
from orchard.core.sandbox import SandboxSpec
from orchard.eval.models import eval_gateway_config
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.sandbox.client import AsyncOrchard

TASK = "orchard__pagekit-112"
PEER = "react"
PHASES = (("wall", "rollout wall time p50"), ("agent", "agent phase p50"),
          ("first_call", "agent start → first model call p50"))


def _seconds(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


async def rollout(harness: str) -> dict[str, float]:
    """One oracle rollout of TASK: the trial's wall time, its agent phase, and agent start → first call."""
    with tempfile.TemporaryDirectory(prefix=f"orchard-bench-{harness}-") as out:
        results = await run_eval(harness=harness, model="oracle", suite="swe-mini", task_ids=[TASK], out_dir=out,
                                 gateway_config=eval_gateway_config("oracle"), parallel=1, backend="local")
        (row,) = results.tasks
        if row.status != "resolved":
            raise RuntimeError(f"{harness} + oracle on {TASK}: {row.status} ({row.error})")
        (trajectory,) = read_jsonl(Path(out) / TRAJECTORIES_FILE, allow_interrupted_tail=False)
    agent = next(phase for phase in trajectory.phases if phase.name == "agent")
    first_call = min(_seconds(call.started_at) for call in trajectory.llm_calls)
    return {"wall": row.wall_time_s, "agent": agent.duration_s, "first_call": first_call - _seconds(agent.started_at)}


def rollout_stats(ctx: BenchContext, harness: str) -> dict[str, LatencyStats]:
    """`harness` and PEER alternating, 5 rollouts each (2 quick) after one warm-up that fills the caches."""
    rollouts, warmup = ctx.pick(5, 2), 1
    samples: dict[str, list[dict[str, float]]] = {harness: [], PEER: []}
    for index in range(warmup + rollouts):
        for name in samples:
            measured = asyncio.run(rollout(name))
            if index >= warmup:
                samples[name].append(measured)
    return {f"{name} {key}": LatencyStats.from_seconds([s[key] for s in runs])
            for name, runs in samples.items() for key, _ in PHASES}


def overhead_rows(stats: dict[str, LatencyStats], harness: str) -> list[Row]:
    rows = []
    for key, what in PHASES:
        ours, peer = stats[f"{harness} {key}"].p50_ms, stats[f"{PEER} {key}"].p50_ms
        rows.append(Row(metric=f"{what}, {harness}", unit="ms", ours=ours, peers={f"{PEER} (in-process)": peer},
                        ratios={f"{harness}/{PEER}": ratio(ours, peer)}))
        rows.append(Row(metric=f"{what}: {harness} overhead over {PEER}", unit="ms", ours=round(ours - peer, 1)))
    return rows


async def _command_times(bundle: str, commands: dict[str, list[str]], count: int, warmup: int,
                         timeout: float) -> dict[str, list[float]]:
    spec = get_bundle_spec(bundle)
    times: dict[str, list[float]] = {name: [] for name in commands}
    async with AsyncOrchard() as orchard:
        sandbox = await orchard.create(SandboxSpec(image="host", bundles=[bundle]))
        try:
            for index in range(warmup + count):
                for name, argv in commands.items():
                    started = time.perf_counter()
                    result = await sandbox.exec(argv, env=spec.entry_env(), timeout=timeout)
                    elapsed = time.perf_counter() - started
                    if result.exit_code != 0:
                        raise RuntimeError(f"{name} failed in the sandbox: {result.stderr[-500:]}")
                    if index >= warmup:
                        times[name].append(elapsed)
        finally:
            await sandbox.close()
    return times


def command_stats(ctx: BenchContext, bundle: str, commands: dict[str, list[str]], timeout: float
                  ) -> dict[str, LatencyStats]:
    """`commands` alternating in one sandbox with `bundle` mounted, 10 times each (3 quick) after a warm-up."""
    times = asyncio.run(_command_times(bundle, commands, ctx.pick(10, 3), 1, timeout))
    return {name: LatencyStats.from_seconds(values) for name, values in times.items()}
