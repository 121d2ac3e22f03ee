"""Measurement: evaluation throughput, `orchard eval` at --parallel 1 vs 8, and the gateway's own cost.

- CPU-bound: react + the oracle on swe-mini. Every step is work on this machine (sandboxes, git, the
  grader's pytest), so running tasks at once can only fill the cores.
- Model-bound: react + the scripted model server answering each call after 200 ms, `step_limit` calls per
  task: the time goes into waiting for the model, which is what parallel rollouts overlap.
- Gateway: a call through the evaluation's gateway (HTTP, litellm, recording) vs the same call straight to
  the scripted server, sequential, median."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import embedded_async_orchard
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats
from orchard.core.task_suite import TaskSuite
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.gateway.litellm_loader import load_litellm

MODEL_DELAY_S = 0.2
ORACLE_SPEEDUP, MODEL_BOUND_SPEEDUP, GATEWAY_ADDED_MS = 1.7, 6.0, 5.0
SCRIPTED_START_TIMEOUT_S = 60


@contextmanager
def scripted_server(delay_s: float) -> Iterator[str]:
    """`python -m orchard.testing.scripted_model` in its own process (as a model server would be), answering every
    call with a `bash true` tool call after `delay_s`; yields its base URL."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-scripted-") as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"loop": True, "delay_s": delay_s, "responses": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}]}))
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "orchard.testing.scripted_model", "--script", str(script),
                                    "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + SCRIPTED_START_TIMEOUT_S
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the scripted server exited: {process.stderr.read().decode()[-800:]}")
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the scripted server did not start")
                time.sleep(0.1)
            yield url + "/v1"
        finally:
            process.terminate()
            process.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def replicated(suite: TaskSuite, count: int) -> TaskSuite:
    """`count` tasks cycling through the suite's, each copy under its own id."""
    tasks = []
    for index in range(count):
        task = suite.tasks[index % len(suite.tasks)]
        tasks.append(task.model_copy(update={"id": f"{task.id}~{index // len(suite.tasks)}"}))
    return TaskSuite(name=suite.name, tasks=tasks)


def busy_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat's aggregate `cpu` line."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def tasks_per_minute(suite: TaskSuite, model: str, config: GatewayConfig, parallel: int,
                     harness_options: dict) -> tuple[float, float]:
    """Tasks per minute, and how many of the machine's cores were busy on average meanwhile."""
    async def measure() -> float:
        with tempfile.TemporaryDirectory(prefix="orchard-bench-eval-") as out:
            async with embedded_async_orchard() as orchard:
                started = time.perf_counter()
                results = await run_eval(harness="react", model=model, suite=suite, out_dir=out,
                                         gateway_config=config, parallel=parallel, harness_options=harness_options,
                                         orchard_client=orchard)
                elapsed = time.perf_counter() - started
        if results.summary.errors:
            first = next(task for task in results.tasks if task.status == "error")
            raise RuntimeError(f"{results.summary.errors} rollout(s) failed; first: {first.error}")
        return len(suite.tasks) / elapsed * 60

    busy_before, total_before = busy_cpu_ticks()
    rate = asyncio.run(measure())
    busy_after, total_after = busy_cpu_ticks()
    cores = os.cpu_count() or 1
    return rate, cores * (busy_after - busy_before) / max(1, total_after - total_before)


def gateway_overhead(base_url: str, calls: int, warmup: int) -> tuple[LatencyStats, LatencyStats]:
    """(direct, through the gateway): the same tiny request, alternating, one at a time, the model server
    answering at once (its script replaced by one without delay)."""
    server = base_url.removesuffix("/v1")
    httpx.put(f"{server}/v1/script", json={"responses": [{"content": "ok"}], "loop": True}).raise_for_status()
    config = GatewayConfig(models={"scripted": ModelRoute(model="openai/scripted", api_base=base_url,
                                                          api_key="unused")})
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    direct, through = [], []
    with LocalGateway(config) as gateway, httpx.Client(timeout=30) as client:
        headers = {"Authorization": f"Bearer {gateway.api_key}", "X-Orchard-Rollout-Key": "bench"}
        for index in range(warmup + calls):
            started = time.perf_counter()
            client.post(f"{base_url}/chat/completions", json=body).raise_for_status()
            middle = time.perf_counter()
            client.post(f"{gateway.base_url}/chat/completions", json=body, headers=headers).raise_for_status()
            ended = time.perf_counter()
            if index >= warmup:
                direct.append(middle - started)
                through.append(ended - middle)
            if index % 50 == 0:
                gateway.end_rollout("bench")  # keep the records of the bench's calls from piling up
    return LatencyStats.from_seconds(direct), LatencyStats.from_seconds(through)


def run(ctx: BenchContext) -> Findings:
    load_litellm()  # seconds of imports, paid once per process: not by whichever run comes first
    swe_mini = load_suite("swe-mini")
    # A rate at --parallel 1 does not depend on how many tasks are run; at --parallel 8 the ramp-up and the
    # last tasks' drain weigh less the more waves there are, as in a real evaluation of a larger suite.
    sizes = {1: ctx.pick(14, 4), 8: ctx.pick(48, 16)}
    model_sizes = {1: ctx.pick(6, 2), 8: ctx.pick(48, 16)}
    steps = ctx.pick(50, 10)
    figures: dict[str, float] = {}
    with ctx.console.status("react + oracle, --parallel 1 and 8"):
        oracle_config = eval_gateway_config("oracle")
        # warm-up, not counted: the harness's and the grader's first imports, the sandbox agent's bundle
        tasks_per_minute(replicated(swe_mini, 1), "oracle", oracle_config, 1, {})
        for parallel, count in sizes.items():
            figures[f"oracle p{parallel}"], figures[f"oracle cores p{parallel}"] = tasks_per_minute(
                replicated(swe_mini, count), "oracle", oracle_config, parallel, {})
    with scripted_server(MODEL_DELAY_S) as base_url:
        scripted = GatewayConfig(models={"scripted": ModelRoute(model="openai/scripted", api_base=base_url,
                                                                api_key="unused")})
        with ctx.console.status(f"react + scripted model ({MODEL_DELAY_S * 1000:.0f} ms/call), --parallel 1 and 8"):
            for parallel, count in model_sizes.items():
                figures[f"model p{parallel}"], _ = tasks_per_minute(replicated(swe_mini, count), "scripted",
                                                                    scripted, parallel, {"step_limit": steps})
        with ctx.console.status("gateway overhead"):
            direct, through = gateway_overhead(base_url, ctx.pick(300, 60), ctx.pick(30, 10))
    added_ms = through.p50_ms - direct.p50_ms
    rows = [
        Row(metric="CPU-bound (oracle): tasks/min at --parallel 8", unit="tasks/min", ours=figures["oracle p8"],
            peers={"--parallel 1": figures["oracle p1"]}, ratios={"p8/p1": ratio(figures["oracle p8"],
                                                                               figures["oracle p1"])},
            targets=[Target(on="p8/p1", op=">=", limit=ORACLE_SPEEDUP)]),
        Row(metric="CPU-bound (oracle): machine cores busy at --parallel 8", unit="cores",
            ours=figures["oracle cores p8"], peers={"--parallel 1": figures["oracle cores p1"]}),
        Row(metric=f"model-bound ({MODEL_DELAY_S * 1000:.0f} ms/call): tasks/min at --parallel 8",
            unit="tasks/min", ours=figures["model p8"], peers={"--parallel 1": figures["model p1"]},
            ratios={"p8/p1": ratio(figures["model p8"], figures["model p1"])},
            targets=[Target(on="p8/p1", op=">=", limit=MODEL_BOUND_SPEEDUP)]),
        Row(metric="gateway added latency per call (p50)", unit="ms", ours=added_ms,
            peers={"direct p50": direct.p50_ms, "through gateway p50": through.p50_ms},
            targets=[Target(op="<=", limit=GATEWAY_ADDED_MS)]),
    ]
    return Findings(rows=rows, latencies={"direct to the model server": direct, "through the gateway": through},
                    notes=[
                        f"Tasks are swe-mini's 14, cycled under distinct ids, run end to end: sandbox, setup, "
                        f"harness, patch, grading in a fresh sandbox, records. Oracle: {sizes[1]} tasks at "
                        f"--parallel 1, {sizes[8]} at --parallel 8; model-bound: {model_sizes[1]} and "
                        f"{model_sizes[8]}. Tasks/min = tasks ÷ the whole run's wall time, gateway start included.",
                        f"Model-bound: the scripted server answers every call with `bash true` after "
                        f"{MODEL_DELAY_S * 1000:.0f} ms; react stops at step_limit={steps}, so each task waits "
                        f"{steps * MODEL_DELAY_S:.1f} s on the model and is then graded (unresolved).",
                        f"CPU-bound: the speed-up is capped by the machine's {os.cpu_count()} cores. "
                        "`--parallel N` runs N agents and up to N gradings beside them, so at --parallel 1 a "
                        "task's grading already overlaps the next task's agent: the cores-busy row shows how much "
                        "of the machine each setting used (all processes, this run's and any other).",
                    ])


MEASUREMENT = Measurement(
    name="eval_throughput",
    title="Evaluation throughput (orchard eval)",
    method=("`run_eval` with the react harness on the swe-mini suite, embedded sandboxes, at `--parallel 1` "
            "and `--parallel 8`: with the oracle (all work on this machine) and with the scripted model server "
            "answering after 200 ms (the time goes to the model). Then 300 sequential tiny chat completions, "
            "alternating between the scripted server directly and the evaluation's own gateway in front of it "
            "(uvicorn + FastAPI + litellm + recording)."),
    run=run,
)
