"""Measurement: in-sandbox harnesses run 8 at once against a 200 ms model — what the run's gateway adds to
each call as the harness sees it, and how much faster `orchard eval --parallel 8` gets through a suite than
`--parallel 1`.

The harness is a plug-in registered for the bench (an entry point in a scratch site directory, as a third
party's would be): it runs a loop agent with the Python of the mini-swe-agent harness bundle inside the task's
sandbox (bundle mounted, model-only network, the rollout's own URL and key), `CALLS` chat completions one
after another through http://127.0.0.1:4000/r/<rollout>/v1, each call's round trip timed inside the sandbox
and written to a file the Trial copies out (native logs); its steps are rebuilt from the gateway's records
(`steps_from_gateway`). The model is the scripted server in its own process, answering after 200 ms."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.eval_throughput import MODEL_DELAY_S, scripted_server
from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats
from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.core.task_suite import TaskSuite
from orchard.eval.runner import run_eval
from orchard.gateway.config import GatewayConfig, ModelRoute

HARNESS, BUNDLE = "bench-loop", "mini-swe-agent"
SPEEDUP, OVERHEAD_P50_MS = 5.0, 5.0
FAST, LITELLM = "fast path", "litellm"
RTTS_FILE = "/workspace/rtts.json"
# The agent inside: standard library only, a new connection per call (as urllib makes them).
LOOP = r'''
import json, os, sys, time, urllib.request
base, key, model, calls = (os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["MODEL"],
                           int(os.environ["CALLS"]))
rtts = []
for step in range(calls):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "step %d" % step}]}).encode()
    request = urllib.request.Request(base + "/chat/completions", body, {"Authorization": "Bearer " + key,
                                                                        "Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    rtts.append(time.perf_counter() - started)
with open(sys.argv[1], "w") as out:
    json.dump(rtts, out)
'''
SOURCE = f'''
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.trajectory import Agent, Trajectory

LOOP = {LOOP!r}


class BenchLoop:
    name, version, bundle, steps_from_gateway = {HARNESS!r}, "0.1", {BUNDLE!r}, True

    def __init__(self, calls=10):
        self.calls = int(calls)

    async def run(self, task, sandbox, model):
        python = get_bundle_spec(self.bundle).mount_point() + "/venv/bin/python"
        env = {{"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": model.api_key.get_secret_value(),
               "MODEL": model.model, "CALLS": str(self.calls)}}
        result = await sandbox.exec([python, "-c", LOOP, {RTTS_FILE!r}], env=env, timeout=600)
        if result.exit_code != 0:
            raise RuntimeError("the loop agent failed: " + result.stderr[-2000:])
        return Trajectory(agent=Agent(name=self.name, version=self.version), task_id=task.id,
                          exit_status="submitted", extra={{"native_logs": [{RTTS_FILE!r}]}})
'''


def _register(site: Path) -> None:
    (site / "orchard_bench_loop.py").write_text(SOURCE)
    dist = site / "orchard_bench_loop-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: orchard-bench-loop\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[orchard.harnesses]\n{HARNESS} = orchard_bench_loop:BenchLoop\n")
    sys.path.insert(0, str(site))


def _suite(count: int, grader: str = "test -s rtts.json") -> TaskSuite:
    environment = TaskEnvironment(image="host", workdir="/workspace")
    return TaskSuite(name="bench-loop", tasks=[
        Task(id=f"loop-{index}", instruction="Call the model.", environment=environment,
             grader=ScriptGrader(script=grader)) for index in range(count)])


def _kimi_rate(config: GatewayConfig, base_url: str, out: Path, count: int, parallel: int, steps: int) -> float:
    """Tasks per minute of the real kimi-cli harness (its bundle, its own agent loop and Shell tool), every
    step a Shell call the scripted model asks for after 200 ms, until Kimi's own step limit."""
    commands = [{"tool_calls": [{"name": "Shell", "arguments": {"command": f"echo step-{index}"}}]}
                for index in range(64)]  # distinct, so Kimi's repeated-call detector never stops a run early
    httpx.put(f"{base_url.removesuffix('/v1')}/v1/script", json={"responses": commands, "loop": True,
                                                                 "delay_s": MODEL_DELAY_S}).raise_for_status()
    suite = _suite(count, grader="true")
    started = time.perf_counter()
    results = asyncio.run(run_eval(harness="kimi-cli", model="scripted", suite=suite, out_dir=out,
                                   gateway_config=config, parallel=parallel, harness_options={"step_limit": steps},
                                   backend="local"))
    elapsed = time.perf_counter() - started
    if results.summary.errors:
        first = next(task for task in results.tasks if task.status == "error")
        raise RuntimeError(f"kimi-cli: {results.summary.errors} rollout(s) ended in an error; first: {first.error}")
    return count / elapsed * 60


def _evaluate(config: GatewayConfig, out: Path, count: int, parallel: int, calls: int) -> tuple[float, list[float]]:
    """(seconds for the whole run, every call's round trip as the harness timed it inside)."""
    started = time.perf_counter()
    results = asyncio.run(run_eval(harness=HARNESS, model="scripted", suite=_suite(count), out_dir=out,
                                   gateway_config=config, parallel=parallel, harness_options={"calls": calls},
                                   backend="local"))
    elapsed = time.perf_counter() - started
    if results.summary.errors or results.summary.resolved != count:
        first = next((task for task in results.tasks if task.status != "resolved"), None)
        raise RuntimeError(f"{count - results.summary.resolved} rollout(s) did not finish properly; first: "
                           f"{first.error if first else 'not run'}")
    rtts = [rtt for path in sorted((out / "native").glob("*/rtts.json")) for rtt in json.loads(path.read_text())]
    if len(rtts) != count * calls:
        raise RuntimeError(f"{len(rtts)} timed calls in the native logs, expected {count * calls}")
    return elapsed, rtts


class DirectCalls:
    """The same call straight to the model server from this machine, one at a time, in a thread, while a
    run goes on: the model's own time under the same load on this machine."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.timings = base_url, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-direct-calls", daemon=True)

    def __enter__(self) -> DirectCalls:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "step"}]}
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                client.post(f"{self.base_url}/chat/completions", json=body).raise_for_status()
                self.timings.append(time.perf_counter() - started)


def run(ctx: BenchContext) -> Findings:
    calls = ctx.pick(20, 8)
    counts = {1: ctx.pick(4, 2), 8: ctx.pick(32, 16)}
    kimi_counts, kimi_steps = {1: ctx.pick(2, 1), 8: ctx.pick(16, 8)}, ctx.pick(10, 4)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-parallel-") as scratch:
        root = Path(scratch)
        (root / "site").mkdir()
        _register(root / "site")
        try:
            with scripted_server(MODEL_DELAY_S) as base_url:
                config = GatewayConfig(models={"scripted": ModelRoute(model="openai/scripted", api_base=base_url,
                                                                      api_key="unused")})
                with ctx.console.status("warm-up: the bundle (built once if needed), one rollout"):
                    _evaluate(config, root / "warm", 1, 1, 2)
                figures, inside, direct = {}, {}, {}
                # the gateway's fast path (the default for this route), then litellm's path for the same calls
                for path, path_config in ((FAST, config), (LITELLM, config.model_copy(update={"fast_path": False}))):
                    for parallel, count in counts.items():
                        with ctx.console.status(f"{count} in-sandbox harnesses, --parallel {parallel}, {calls} calls "
                                                f"of {MODEL_DELAY_S * 1000:.0f} ms each, gateway: {path}"), \
                                DirectCalls(base_url) as beside:
                            elapsed, rtts = _evaluate(path_config, root / f"{path}-p{parallel}", count, parallel,
                                                      calls)
                        figures[path, parallel] = count / elapsed * 60
                        inside[path, parallel] = LatencyStats.from_seconds(rtts)
                        direct[path, parallel] = LatencyStats.from_seconds(beside.timings)
                kimi = {}
                for parallel, count in kimi_counts.items():
                    with ctx.console.status(f"kimi-cli × {count}, --parallel {parallel}, {kimi_steps} steps each"):
                        kimi[parallel] = _kimi_rate(config, base_url, root / f"kimi-p{parallel}", count, parallel,
                                                    kimi_steps)
        finally:
            sys.path.remove(str(root / "site"))
    added = {key: stats.p50_ms - direct[key].p50_ms for key, stats in inside.items()}
    rows = [
        Row(metric=f"in-sandbox harnesses, {MODEL_DELAY_S * 1000:.0f} ms model: tasks/min at --parallel 8",
            unit="tasks/min", ours=figures[FAST, 8], peers={"--parallel 1": figures[FAST, 1]},
            ratios={"p8/p1": ratio(figures[FAST, 8], figures[FAST, 1])},
            targets=[Target(on="p8/p1", op=">=", limit=SPEEDUP)]),
        Row(metric="gateway overhead per call, 8 harnesses at once (p50, as the harness times it)", unit="ms",
            ours=round(added[FAST, 8], 2), peers={"litellm's path": round(added[LITELLM, 8], 2),
                                                  "call inside p50": inside[FAST, 8].p50_ms,
                                                  "model direct p50": direct[FAST, 8].p50_ms},
            targets=[Target(op="<=", limit=OVERHEAD_P50_MS)]),
        Row(metric="gateway overhead per call, one harness (p50)", unit="ms", ours=round(added[FAST, 1], 2),
            peers={"litellm's path": round(added[LITELLM, 1], 2), "call inside p50": inside[FAST, 1].p50_ms,
                   "model direct p50": direct[FAST, 1].p50_ms}),
        Row(metric=f"kimi-cli (the real harness), {MODEL_DELAY_S * 1000:.0f} ms model: tasks/min at --parallel 8",
            unit="tasks/min", ours=kimi[8], peers={"--parallel 1": kimi[1]}, ratios={"p8/p1": ratio(kimi[8], kimi[1])}),
    ]
    return Findings(rows=rows, latencies={"call inside the sandbox, --parallel 8": inside[FAST, 8],
                                          "call inside the sandbox, --parallel 1": inside[FAST, 1],
                                          "the same through litellm's path, --parallel 8": inside[LITELLM, 8],
                                          "the model server directly, during --parallel 8": direct[FAST, 8]}, notes=[
        f"Each task: a local sandbox with the mini-swe-agent bundle mounted and model-only networking; the "
        f"harness runs {calls} chat completions one after another (a loop agent on the bundle's Python 3.13, "
        f"standard library, a new connection per call), then the task is graded by a script in its sandbox. "
        f"--parallel 1 ran {counts[1]} tasks, --parallel 8 ran {counts[8]}; tasks/min = tasks ÷ the run's wall "
        "time (gateway start, sandboxes, grading included).",
        "Overhead = the p50 of the calls' round trips timed inside the sandbox (agent's forwarder on "
        "127.0.0.1:4000 → the run's gateway on its Unix socket → the fast path → the scripted server) minus the p50 "
        "of the same call straight to the scripted server from this machine, one at a time in a thread of the "
        "bench while the same run goes on (the same load on the machine's cores).",
        "The route is `openai/scripted` with an api_base, which the gateway's fast path serves (a pooled HTTP client "
        "straight to the server, docs/gateway.md); the peer `litellm's path` is the same runs with the gateway's "
        "`fast_path` off, so every call goes through `litellm.acompletion` as before.",
        "The loop agent is not a real harness: it isolates what the evaluator and the gateway add. The kimi-cli "
        f"row runs the real Kimi-CLI from its bundle ({kimi_steps} steps of `Shell echo ...` asked by the scripted "
        f"model, then its own step limit; {kimi_counts[1]} tasks at --parallel 1, {kimi_counts[8]} at 8): its "
        "start-up (seconds of imports) and its tools are work on this machine's cores, which 8 parallel runs "
        "share, so its speed-up is bounded by the cores, not by the model's latency.",
    ])


MEASUREMENT = Measurement(
    name="parallel_harnesses",
    title="Parallel in-sandbox harnesses (gateway overhead, eval speed-up)",
    method=("`run_eval` with an in-sandbox bench harness (a loop agent on the mini-swe-agent bundle's Python, "
            "through the run's gateway) against the scripted model server answering after 200 ms: a few tasks "
            "at `--parallel 1`, 32 at `--parallel 8`, every call's round trip timed inside the sandbox, and "
            "meanwhile the same call straight to the model server, one at a time; then the same runs with the "
            "gateway's fast path off (litellm's path) as the peer."),
    run=run,
)
