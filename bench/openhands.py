"""Measurement: what running the OpenHands SDK inside the sandbox costs.

- Per-rollout overhead: the same oracle task (swe-mini `orchard__pagekit-112`) with the `openhands` harness
  (the SDK's agent from its bundle, in the sandbox, through the gateway over the sandbox's loopback) and with
  the in-process `react` harness, one rollout per `orchard eval` run, alternating: the rollout's wall time
  (sandbox, agent, patch, grading), the agent phase alone, and the time from the agent phase's start to the
  first model call (the harness starting up).
- Start time: the rollouts' time from the agent phase's start to the SDK's first model call (config written,
  the driver started, the SDK and its tools imported, the agent, its terminal and system prompt made, the
  request sent) against the floor `python -c 'import openhands.sdk'` run by the bundle's Python in a sandbox
  with the bundle mounted. Target: ≤ 1.5× the floor. Beside it, the bundle's Python importing what the
  driver imports before the conversation starts (the SDK and the default preset's tools), for scale."""

from __future__ import annotations

import asyncio
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.jsonl import read_jsonl
from orchard.core.sandbox import SandboxSpec
from orchard.eval.models import eval_gateway_config
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.sandbox.client import AsyncOrchard

TASK = "orchard__pagekit-112"
START_RATIO = 1.5
HARNESSES = ("openhands", "react")
FLOOR = "python -c 'import openhands.sdk'"
DRIVER_IMPORTS = "python -c 'import <what the driver imports>'"
DRIVER_MODULES = ("litellm", "openhands.sdk", "openhands.tools.preset.default", "openhands.tools.terminal",
                  "openhands.tools.file_editor", "openhands.tools.task_tracker")


def _seconds(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


async def _rollout(harness: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="orchard-bench-openhands-") as out:
        results = await run_eval(harness=harness, model="oracle", suite="swe-mini", task_ids=[TASK], out_dir=out,
                                 gateway_config=eval_gateway_config("oracle"), parallel=1, backend="local")
        (row,) = results.tasks
        if row.status != "resolved":
            raise RuntimeError(f"{harness} + oracle on {TASK}: {row.status} ({row.error})")
        (trajectory,) = read_jsonl(Path(out) / TRAJECTORIES_FILE, allow_interrupted_tail=False)
    agent = next(phase for phase in trajectory.phases if phase.name == "agent")
    first_call = min(_seconds(call.started_at) for call in trajectory.llm_calls)
    return {"wall": row.wall_time_s, "agent": agent.duration_s, "first_call": first_call - _seconds(agent.started_at)}


async def _start_times(count: int, warmup: int) -> dict[str, list[float]]:
    spec = get_bundle_spec("openhands")
    python = f"{spec.mount_point()}/venv/bin/python"
    commands = {FLOOR: [python, "-c", "import openhands.sdk"],
                DRIVER_IMPORTS: [python, "-c", "import " + ", ".join(DRIVER_MODULES)]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    async with AsyncOrchard() as orchard:
        sandbox = await orchard.create(SandboxSpec(image="host", bundles=["openhands"]))
        try:
            for index in range(warmup + count):
                for name, argv in commands.items():
                    started = time.perf_counter()
                    result = await sandbox.exec(argv, env=spec.entry_env(), timeout=180)
                    elapsed = time.perf_counter() - started
                    if result.exit_code != 0:
                        raise RuntimeError(f"{name} failed in the sandbox: {result.stderr[-500:]}")
                    if index >= warmup:
                        times[name].append(elapsed)
        finally:
            await sandbox.close()
    return times


def run(ctx: BenchContext) -> Findings:
    rollouts, warmup = ctx.pick(5, 2), 1
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in HARNESSES}
    for index in range(warmup + rollouts):  # the first of each builds caches (bundle, agent bundle, suite)
        for harness in HARNESSES:
            measured = asyncio.run(_rollout(harness))
            if index >= warmup:
                samples[harness].append(measured)
    starts = asyncio.run(_start_times(ctx.pick(10, 3), 1))
    stats = {name: LatencyStats.from_seconds(values) for name, values in starts.items()}
    for harness in HARNESSES:
        for key in ("wall", "agent", "first_call"):
            stats[f"{harness} {key}"] = LatencyStats.from_seconds([s[key] for s in samples[harness]])

    def p50(name: str) -> float:
        return stats[name].p50_ms

    rows = []
    for key, what in (("wall", "rollout wall time p50"), ("agent", "agent phase p50"),
                      ("first_call", "agent start → first model call p50")):
        ours, react = p50(f"openhands {key}"), p50(f"react {key}")
        rows.append(Row(metric=f"{what}, openhands", unit="ms", ours=ours, peers={"react (in-process)": react},
                        ratios={"openhands/react": ratio(ours, react)}))
        rows.append(Row(metric=f"{what}: openhands overhead over react", unit="ms", ours=round(ours - react, 1)))
    start, floor, imports = p50("openhands first_call"), p50(FLOOR), p50(DRIVER_IMPORTS)
    rows.append(Row(metric="openhands start: agent start → first model call p50", unit="ms", ours=start,
                    peers={"floor: " + FLOOR: floor, DRIVER_IMPORTS: imports},
                    ratios={"start/floor": ratio(start, floor), "start/driver imports": ratio(start, imports)},
                    targets=[Target(on="start/floor", op="<=", limit=START_RATIO)]))
    return Findings(rows=rows, latencies=stats, notes=[
        "Both harnesses play the same reference patch with the oracle (3 model calls each: two `terminal` "
        "calls and `finish` for openhands; bash, bash, submit for react). Each rollout is one `orchard eval` "
        "run on the embedded local backend; the wall time is the trial's (sandbox, agent, patch, grading).",
        "openhands' agent phase holds writing its config, starting the driver (CPython 3.13 from the bundle, "
        "the SDK, litellm and the default tools), the agent's terminal session, three model calls through the "
        "gateway over the sandbox's loopback, closing the conversation and copying its events out.",
        "The driver imports " + ", ".join(f"`{m}`" for m in DRIVER_MODULES) + " before its first model "
        "call; `import openhands.sdk` alone already loads the SDK's LLM layer (litellm) and its agent.",
    ])


MEASUREMENT = Measurement(
    name="openhands",
    title="OpenHands SDK in the sandbox: per-rollout overhead and start time",
    method=("One swe-mini task (orchard__pagekit-112) with the oracle, `openhands` and in-process `react` "
            "alternating, 5 rollouts each after one warm-up, one `orchard eval` run per rollout (local backend). "
            "The start time is the rollouts' agent start → first model call. Then, in one sandbox with the "
            "openhands bundle mounted, the floor `python -c 'import openhands.sdk'` and the driver's imports, "
            "alternating, 10 times each after 1 warm-up."),
    run=run,
)
