"""Measurement: what running the real Kimi-CLI inside the sandbox costs.

- Per-rollout overhead: the same oracle task (swe-mini `orchard__pagekit-112`) with the `kimi-cli` harness
  (Kimi from its bundle, in the sandbox, through the gateway over the sandbox's loopback) and with the
  in-process `react` harness, one rollout per `orchard eval` run, alternating: the rollout's wall time
  (sandbox, agent, patch, grading), the agent phase alone, and the time from the agent phase's start to the
  first model call (the harness starting up).
- Start time: the rollouts' time from the agent phase's start to Kimi's first model call (config written,
  Kimi started, its agent, tools and system prompt loaded, the request sent) against the floor: the bundle's
  Python importing the modules a print run loads before that call (Kimi's CLI, app, print UI, soul, its
  OpenAI provider and the default agent's tool modules), in a sandbox with the bundle mounted. Target:
  ≤ 1.5× the floor. `import kimi_cli` alone loads only the package's nearly empty `__init__` (~50 ms), so
  it is shown beside `kimi --version` for scale, not as the floor."""

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
HARNESSES = ("kimi-cli", "react")


def _seconds(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


async def _rollout(harness: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="orchard-bench-kimi-") as out:
        results = await run_eval(harness=harness, model="oracle", suite="swe-mini", task_ids=[TASK], out_dir=out,
                                 gateway_config=eval_gateway_config("oracle"), parallel=1, backend="local")
        (row,) = results.tasks
        if row.status != "resolved":
            raise RuntimeError(f"{harness} + oracle on {TASK}: {row.status} ({row.error})")
        (trajectory,) = read_jsonl(Path(out) / TRAJECTORIES_FILE, allow_interrupted_tail=False)
    agent = next(phase for phase in trajectory.phases if phase.name == "agent")
    first_call = min(_seconds(call.started_at) for call in trajectory.llm_calls)
    return {"wall": row.wall_time_s, "agent": agent.duration_s, "first_call": first_call - _seconds(agent.started_at)}


KIMI_MODULES = ("kimi_cli.cli", "kimi_cli.app", "kimi_cli.ui.print", "kimi_cli.soul.kimisoul",
                "kosong.contrib.chat_provider.openai_legacy",  # and the default agent's tools (its agent.yaml):
                *(f"kimi_cli.tools.{name}" for name in ("agent", "ask_user", "todo", "shell", "background", "file",
                                                        "web", "plan", "plan.enter")))
FLOOR = "python -c 'import <what a print run loads>'"


async def _start_times(count: int, warmup: int) -> dict[str, list[float]]:
    spec = get_bundle_spec("kimi-cli")
    python = f"{spec.mount_point()}/venv/bin/python"
    commands = {FLOOR: [python, "-c", "import " + ", ".join(KIMI_MODULES)],
                "kimi --version": spec.entry_argv("--version"),
                "python -c 'import kimi_cli'": [python, "-c", "import kimi_cli"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    async with AsyncOrchard() as orchard:
        sandbox = await orchard.create(SandboxSpec(image="host", bundles=["kimi-cli"]))
        try:
            for index in range(warmup + count):
                for name, argv in commands.items():
                    started = time.perf_counter()
                    result = await sandbox.exec(argv, env=spec.entry_env(), timeout=120)
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
        kimi, react = p50(f"kimi-cli {key}"), p50(f"react {key}")
        rows.append(Row(metric=f"{what}, kimi-cli", unit="ms", ours=kimi, peers={"react (in-process)": react},
                        ratios={"kimi-cli/react": ratio(kimi, react)}))
        rows.append(Row(metric=f"{what}: kimi-cli overhead over react", unit="ms", ours=round(kimi - react, 1)))
    start, floor = p50("kimi-cli first_call"), p50(FLOOR)
    rows.append(Row(metric="kimi-cli start: agent start → first model call p50", unit="ms", ours=start,
                    peers={"floor: " + FLOOR: floor}, ratios={"start/floor": ratio(start, floor)},
                    targets=[Target(on="start/floor", op="<=", limit=START_RATIO)]))
    version, package = p50("kimi --version"), p50("python -c 'import kimi_cli'")
    rows.append(Row(metric="kimi --version p50", unit="ms", ours=version,
                    peers={"python -c 'import kimi_cli'": package}, ratios={"version/import": ratio(version, package)}))
    return Findings(rows=rows, latencies=stats, notes=[
        "Both harnesses play the same reference patch with the oracle (kimi-cli: 4 model calls — three Shell "
        "calls and the reply that ends its turn; react: 3). Each rollout is one `orchard eval` run on the "
        "embedded local backend; the wall time is the trial's (sandbox, agent, patch, grading).",
        "kimi-cli's agent phase holds writing its config, starting Kimi (CPython 3.13 from the bundle, its "
        "CLI, agent spec and tools), four model calls through the gateway over the sandbox's loopback, and "
        "reading its session logs back out of the sandbox.",
        "The start-time floor imports what Kimi needs before its first model call: "
        + ", ".join(f"`{m}`" for m in KIMI_MODULES) + ". `import kimi_cli` alone loads only the package's "
        "nearly empty `__init__`, which no run of Kimi could approach.",
    ])


MEASUREMENT = Measurement(
    name="kimi_cli",
    title="Kimi-CLI in the sandbox: per-rollout overhead and start time",
    method=("One swe-mini task (orchard__pagekit-112) with the oracle, `kimi-cli` and in-process `react` "
            "alternating, 5 rollouts each after one warm-up, one `orchard eval` run per rollout (local backend). "
            "The start time is the rollouts' agent start → first model call. Then, in one sandbox with the "
            "kimi-cli bundle mounted, the floor (the bundle's Python importing the modules a print run loads "
            "before its first call), `kimi --version` and `python -c 'import kimi_cli'`, alternating, 10 times "
            "each after 1 warm-up."),
    run=run,
)
