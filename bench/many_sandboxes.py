"""Measurement 4: many live sandboxes under load — 256 sandboxes, 10,000 execs spread over them with
bounded concurrency (AsyncOrchard). Wall time, execs/s, failures, peak host memory; beside the floor
server taking the same load alone (no sandboxes, one process)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.host_memory import HostMemorySampler
from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import embedded_async_orchard
from bench.peers.floor import AsyncFloorClient, floor_server
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats

COMMAND = "true"
CREATE_CONCURRENCY = 16
EXEC_TIMEOUT_S = 60.0
FLOOR = "floor (1 server, no sandbox)"


@dataclass
class LoadOutcome:
    wall_s: float = 0.0
    done: int = 0
    failures: int = 0
    first_failure: str = ""
    latencies: list[float] = field(default_factory=list)


async def run_load(call: Callable[[int], Awaitable[int | None]], total: int, concurrency: int,
                    deadline_s: float, on_done: Callable[[], None]) -> LoadOutcome:
    """`total` calls by `concurrency` workers; a call failing, timing out or returning a non-zero exit code
    counts as a failure, and calls not started before the deadline count as failures too."""
    outcome = LoadOutcome()
    indices = iter(range(total))
    started = time.perf_counter()
    deadline = started + deadline_s

    async def worker() -> None:
        for index in indices:
            if time.perf_counter() > deadline:
                outcome.failures += 1
                outcome.first_failure = outcome.first_failure or f"not started within {deadline_s:.0f} s"
                continue
            t0 = time.perf_counter()
            try:
                exit_code = await asyncio.wait_for(call(index), EXEC_TIMEOUT_S)
                if exit_code != 0:
                    raise RuntimeError(f"exit code {exit_code}")
                outcome.latencies.append(time.perf_counter() - t0)
            except Exception as exc:  # each failure (timeouts included) is counted; the load goes on
                outcome.failures += 1
                outcome.first_failure = outcome.first_failure or f"{type(exc).__name__}: {exc}"
            outcome.done += 1
            on_done()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    outcome.wall_s = time.perf_counter() - started
    return outcome


def _progress(ctx: BenchContext) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=ctx.console, transient=True)


async def _measure(ctx: BenchContext, sandboxes: int, execs: int, concurrency: int,
                   deadline_s: float) -> tuple[float, LoadOutcome, HostMemorySampler, LoadOutcome]:
    with _progress(ctx) as progress:
        async with embedded_async_orchard() as orchard, HostMemorySampler() as memory:
            creating = progress.add_task(f"create {sandboxes} sandboxes", total=sandboxes)
            gate = asyncio.Semaphore(CREATE_CONCURRENCY)

            async def create_one():
                async with gate:
                    sandbox = await orchard.create()
                progress.advance(creating)
                return sandbox

            started = time.perf_counter()
            live = await asyncio.gather(*(create_one() for _ in range(sandboxes)))
            create_s = time.perf_counter() - started

            async def orchard_exec(index: int) -> int | None:
                return (await live[index % sandboxes].exec(COMMAND)).exit_code

            running = progress.add_task(f"{execs} execs over {sandboxes} sandboxes", total=execs)
            load = await run_load(orchard_exec, execs, concurrency, deadline_s,
                                   lambda: progress.advance(running))
            # Closing the client deletes all the sandboxes (they were created through it).

        with floor_server() as server:
            async with AsyncFloorClient(server.url, max_connections=concurrency) as floor:
                async def floor_exec(index: int) -> int | None:
                    return (await floor.exec(COMMAND))["exit_code"]

                running = progress.add_task(f"{execs} execs on the floor server", total=execs)
                floor_load = await run_load(floor_exec, execs, concurrency, deadline_s,
                                             lambda: progress.advance(running))
    return create_s, load, memory, floor_load


def run(ctx: BenchContext) -> Findings:
    sandboxes, execs = ctx.pick(256, 16), ctx.pick(10_000, 400)
    concurrency = ctx.pick(64, 16)
    deadline_s = ctx.pick(1800, 300)
    create_s, load, memory, floor_load = asyncio.run(_measure(ctx, sandboxes, execs, concurrency, deadline_s))

    rate = (load.done - load.failures) / load.wall_s
    floor_rate = (floor_load.done - floor_load.failures) / floor_load.wall_s
    latencies = {}
    if load.latencies:
        latencies["Orchard exec under load"] = LatencyStats.from_seconds(load.latencies)
    if floor_load.latencies:
        latencies["floor exec under load"] = LatencyStats.from_seconds(floor_load.latencies)
    rows = [
        Row(metric=f"{execs:,} execs over {sandboxes} sandboxes, wall time", unit="s", ours=load.wall_s,
            peers={FLOOR: floor_load.wall_s}, ratios={"orchard/floor": ratio(load.wall_s, floor_load.wall_s)}),
        Row(metric="throughput", unit="execs/s", ours=rate, peers={FLOOR: floor_rate},
            ratios={"orchard/floor": ratio(rate, floor_rate)}),
        Row(metric="failures", unit="", ours=load.failures, peers={FLOOR: floor_load.failures},
            targets=[Target(op="<=", limit=0)]),
        Row(metric=f"create {sandboxes} sandboxes ({CREATE_CONCURRENCY} at a time)", unit="s", ours=create_s),
        Row(metric="peak host memory in use", unit="MB", ours=memory.peak_mb),
        Row(metric=f"host memory growth ({sandboxes} sandboxes + load)", unit="MB",
            ours=memory.peak_mb - memory.baseline_mb),
        Row(metric="host memory growth per sandbox", unit="MB",
            ours=(memory.peak_mb - memory.baseline_mb) / sandboxes),
    ]
    notes = [f"{concurrency} execs in flight at a time; exec `i` goes to sandbox `i mod {sandboxes}`. "
             f"Each exec has a {EXEC_TIMEOUT_S:.0f} s timeout and the whole load a {deadline_s} s deadline; "
             "a timeout, an error or a non-zero exit code counts as a failure.",
             "Host memory is MemTotal − MemAvailable, sampled every 0.2 s from before the first sandbox "
             "is created until the load ends; it includes everything else running on the machine."]
    if load.first_failure:
        notes.append(f"First Orchard failure: {load.first_failure}")
    if floor_load.first_failure:
        notes.append(f"First floor failure: {floor_load.first_failure}")
    return Findings(rows=rows, latencies=latencies, notes=notes)


MEASUREMENT = Measurement(
    name="many_sandboxes",
    title="256 live sandboxes, 10,000 execs",
    method=("With the async SDK, 256 sandboxes are created (16 at a time) and kept alive; then 10,000 execs "
            "of `true` are spread over them round-robin by 64 concurrent workers. The same 10,000 execs, "
            "64 at a time, then go to one floor server (no sandboxes) for comparison."),
    run=run,
)
