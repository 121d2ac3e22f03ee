"""Measurement 5: the in-sandbox agent's resident memory, idle and after 1000 execs, beside the floor
server's and SWE-ReX's server's after the same work."""

from __future__ import annotations

import asyncio

from rich.progress import Progress

from bench.measurement import BenchContext, Measurement
from bench.memory import host_process
from bench.orchard_clients import agent_memory, checked_exec, embedded_orchard
from bench.peers.floor import FloorClient, floor_server
from bench.peers.swerex import remote_runtime, swerex_execute, swerex_server
from bench.results_model import Findings, Row, Target, ratio

COMMAND = "true"
AGENT_RSS_MB = 25.0
FLOOR, SWEREX = "floor server", "SWE-ReX server"


def run(ctx: BenchContext) -> Findings:
    execs = ctx.pick(1000, 100)
    with Progress(console=ctx.console, transient=True) as progress:
        with embedded_orchard() as orchard, orchard.create() as sandbox:
            agent = agent_memory(orchard, sandbox)
            agent_idle = agent.rss_mb()
            task = progress.add_task(f"{execs} execs in a sandbox", total=execs)
            for _ in range(execs):
                checked_exec(sandbox, COMMAND)
                progress.advance(task)
            agent_after, agent_peak = agent.rss_mb(), agent.peak_mb()

        with floor_server() as server, FloorClient(server.url) as floor:
            process = host_process(server.pid)
            floor.exec(COMMAND)  # the first request starts its handler thread
            floor_idle = process.rss_mb()
            task = progress.add_task(f"{execs} execs on the floor server", total=execs)
            for _ in range(execs):
                floor.exec(COMMAND)
                progress.advance(task)
            floor_after = process.rss_mb()

        with swerex_server() as server:
            process, runtime = host_process(server.pid), remote_runtime(server)
            swerex_idle = process.rss_mb()
            task = progress.add_task(f"{execs} execs on SWE-ReX", total=execs)

            async def swerex_load() -> None:
                for _ in range(execs):
                    await swerex_execute(runtime, COMMAND)
                    progress.advance(task)

            asyncio.run(swerex_load())
            swerex_after = process.rss_mb()

    rows = [
        Row(metric="agent RSS, idle", unit="MB", ours=agent_idle, peers={FLOOR: floor_idle, SWEREX: swerex_idle},
            ratios={"orchard/floor": ratio(agent_idle, floor_idle), "orchard/swerex": ratio(agent_idle, swerex_idle)},
            targets=[Target(op="<=", limit=AGENT_RSS_MB)]),
        Row(metric=f"agent RSS after {execs} execs", unit="MB", ours=agent_after,
            peers={FLOOR: floor_after, SWEREX: swerex_after},
            ratios={"orchard/floor": ratio(agent_after, floor_after),
                    "orchard/swerex": ratio(agent_after, swerex_after)},
            targets=[Target(op="<=", limit=AGENT_RSS_MB)]),
        Row(metric="agent peak RSS (VmHWM) over its life", unit="MB", ours=agent_peak),
    ]
    return Findings(rows=rows, notes=[
        "The agent's VmRSS is read from `/proc/<pid>/status` inside its sandbox, `pid` being the one its "
        "`/health` reports (a pid of the sandbox's pid namespace); the peers' from the host's /proc.",
        "MB here are 10^6 bytes (the kernel reports KiB).",
    ])


MEASUREMENT = Measurement(
    name="agent_rss",
    title="Agent memory",
    method=("A fresh sandbox's agent: resident memory (VmRSS) idle, then after 1000 execs of `true` through "
            "the sync SDK. The floor server and SWE-ReX's server are measured the same way (idle after their "
            "first request, then after 1000 execs)."),
    run=run,
)
