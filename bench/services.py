"""Task services: what starting a task's services adds to a trial's environment phase. The phase is timed
as the evaluator runs it (`create_task_sandbox`: the sandbox, files, setup, services ready) for the same
task with three small services (stdlib HTTP servers, each with a port and a health check) and without any,
in alternating blocks, on the embedded local backend."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.latency import measure_interleaved
from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target

ADDED_P50_TARGET_MS = 150.0
# A small service: answers every GET with 200 (its health check included); prints when it listens, so the
# bench can tell the services' own start from what Orchard adds after it.
SERVER = r"""
import http.server, sys, time
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("listening", time.time(), flush=True)
server.serve_forever()
"""


def own_start(server: Path, k: int) -> list[float]:
    """The peer: the same three servers started at once straight on the host (no sandbox, no Orchard) by the
    same interpreter as `python3` in a host-image sandbox (Orchard's own, first on its PATH), timed until
    each accepts a connection."""
    durations = []
    for _ in range(k):
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, str(server), str(8200 + i)], stdout=subprocess.DEVNULL)
                 for i in range(3)]
        try:
            for i in range(3):
                while True:
                    with socket.socket() as sock:
                        if sock.connect_ex(("127.0.0.1", 8200 + i)) == 0:
                            break
                    if procs[i].poll() is not None:
                        raise RuntimeError(f"the bench's server ended with {procs[i].returncode}")
                    time.sleep(0.001)
            durations.append(time.perf_counter() - started)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    return durations


def environment_phase(runner: asyncio.Runner, orchard, task, after=None):
    """A block for measure_interleaved: k environment phases of `task` (`create_task_sandbox`, as the
    evaluator runs it), each timed and its sandbox then deleted; `after(task, sandbox)` runs untimed
    before the delete."""
    from orchard.eval.task_sandbox import create_task_sandbox

    async def timed(k: int) -> list[float]:
        durations = []
        for _ in range(k):
            started = time.perf_counter()
            sandbox = await create_task_sandbox(orchard, task)
            durations.append(time.perf_counter() - started)
            try:
                if after is not None:
                    await after(task, sandbox)
            finally:
                await sandbox.close()
        return durations
    return lambda k: runner.run(timed(k))


def run(ctx: BenchContext) -> Findings:
    from orchard.core.task import Task, TaskEnvironment, TaskFile, TaskService
    from orchard.sandbox.client import AsyncOrchard

    files = [TaskFile(path="/tmp/server.py", content=SERVER)]
    services = [TaskService(name=f"svc{i}", command=f"exec python3 /tmp/server.py {8100 + i}", port=8100 + i,
                            health_check="/health") for i in range(3)]
    with_services = Task(id="three-services", instruction="-", environment=TaskEnvironment(files=files,
                                                                                            services=services))
    without = Task(id="no-services", instruction="-", environment=TaskEnvironment(files=files))

    with asyncio.Runner() as runner:
        orchard = runner.run(AsyncOrchard().__aenter__())
        try:
            after_listening: list[float] = []

            async def listened_until_ready(task, sandbox) -> None:
                if task.environment.services:
                    ready_at = time.time()
                    listened = [float(s.log.split()[1]) for s in await sandbox.services()]
                    after_listening.append(ready_at - max(listened))

            def block(task):
                return environment_phase(runner, orchard, task, after=listened_until_ready)

            with tempfile.TemporaryDirectory() as scratch:
                server = Path(scratch) / "server.py"
                server.write_text(SERVER)
                stats = measure_interleaved({"three services": block(with_services), "none": block(without),
                                             "the three servers alone, on the host": lambda k: own_start(server, k)},
                                            warmup=2, runs=ctx.pick(40, 6), rounds=ctx.pick(8, 2))
        finally:
            runner.run(orchard.__aexit__(None, None, None))
    three, none = stats["three services"], stats["none"]
    alone = stats["the three servers alone, on the host"]
    after = sorted(after_listening)[len(after_listening) // 2] * 1000
    return Findings(rows=[
        Row(metric="environment phase p50, three services ready", unit="ms", ours=three.p50_ms,
            peers={"the same task without services": none.p50_ms}),
        Row(metric="added by three services, p50", unit="ms", ours=three.p50_ms - none.p50_ms,
            targets=[Target(op="<=", limit=ADDED_P50_TARGET_MS)]),
        Row(metric="the three servers' own start, at once, straight on the host (no sandbox), p50", unit="ms",
            ours=alone.p50_ms),
        Row(metric="added beyond the servers' own start (Orchard's part), p50", unit="ms",
            ours=three.p50_ms - none.p50_ms - alone.p50_ms),
        Row(metric="environment phase p99, three services ready", unit="ms", ours=three.p99_ms,
            peers={"the same task without services": none.p99_ms}),
        Row(metric="from the last service listening to the phase's end (health checks, polling), p50",
            unit="ms", ours=after),
    ], latencies=stats, notes=[
        "With services the sandbox's agent runs under a uid of its own (it keeps the capability to start "
        "the services as theirs), so the figure includes that start path too.",
        "Each service is a Python interpreter starting an HTTP server (`http.server`, ~55 ms of CPU to import "
        "here): three at once on this host's cores are most of the figure, as the row of the same three "
        "servers started straight on the host shows. The agent waits for them inside the sandbox "
        "(`POST /services/wait`: every 2 ms the listening ports from the kernel's sock_diag, then one GET of "
        "each health check); the evaluator asks it once.",
    ])


MEASUREMENT = Measurement(
    name="services",
    title="Task services: their cost in a trial's environment phase",
    method=("The evaluator's environment phase (`create_task_sandbox`) for a task on the host image with three "
            "stdlib HTTP services (a port and a health check each) and for the same task without them, in "
            "alternating blocks over several rounds on the embedded local backend; each sandbox is deleted "
            "after its phase is timed."),
    run=run,
)
