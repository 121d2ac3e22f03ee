"""Measurement 1: the round trip of running `true`, Orchard against the floor and SWE-ReX, side by side."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack, asynccontextmanager

from rich.progress import Progress

from bench.latency import async_block, enter_async, measure_interleaved, sync_block
from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import embedded_async_orchard, embedded_orchard
from bench.peers.floor import FloorClient, floor_server
from bench.peers.swerex import (remote_runtime, swerex_execute, swerex_server, swerex_session,
                                swerex_session_run)
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats

COMMAND = "true"
ORCHARD_SYNC, ORCHARD_ASYNC = "Orchard exec (sync SDK)", "Orchard exec (async SDK)"
SESSION_SYNC, SESSION_ASYNC = "Orchard session (sync SDK)", "Orchard session (async SDK)"
FLOOR, SWEREX_EXEC, SWEREX_SESSION = "floor", "SWE-ReX execute", "SWE-ReX session"

EXEC_P50_MS, EXEC_P99_MS, FLOOR_RATIO = 2.5, 10.0, 1.5
SESSION_P50_MS, SESSION_SPEEDUP = 5.0, 25.0


def _exec_row(label: str, percentile: str, ours: LatencyStats, floor: LatencyStats, swerex: LatencyStats,
              targets: list[Target]) -> Row:
    """`percentile` is "p50" or "p99": that figure of each distribution, side by side."""
    ours_ms, floor_ms, swerex_ms = (getattr(s, f"{percentile}_ms") for s in (ours, floor, swerex))
    return Row(metric=f"exec `{COMMAND}` {percentile}, {label}", unit="ms", ours=ours_ms,
               peers={FLOOR: floor_ms, SWEREX_EXEC: swerex_ms},
               ratios={"orchard/floor": ratio(ours_ms, floor_ms), "swerex_execute/orchard": ratio(swerex_ms, ours_ms)},
               targets=targets)


def _exec_rows(label: str, ours: LatencyStats, floor: LatencyStats, swerex: LatencyStats) -> list[Row]:
    return [
        _exec_row(label, "p50", ours, floor, swerex, [
            Target(op="<=", limit=EXEC_P50_MS), Target(on="orchard/floor", op="<=", limit=FLOOR_RATIO),
            Target(on="swerex_execute/orchard", op=">", limit=1.0)]),
        _exec_row(label, "p99", ours, floor, swerex, [Target(op="<=", limit=EXEC_P99_MS)]),
    ]


def _session_rows(label: str, ours: LatencyStats, swerex: LatencyStats) -> list[Row]:
    return [
        Row(metric=f"session `{COMMAND}` p50, {label}", unit="ms", ours=ours.p50_ms,
            peers={SWEREX_SESSION: swerex.p50_ms},
            ratios={"swerex_session/orchard_session": ratio(swerex.p50_ms, ours.p50_ms)},
            targets=[Target(op="<=", limit=SESSION_P50_MS),
                     Target(on="swerex_session/orchard_session", op=">=", limit=SESSION_SPEEDUP)]),
        Row(metric=f"session `{COMMAND}` p99, {label}", unit="ms", ours=ours.p99_ms,
            peers={SWEREX_SESSION: swerex.p99_ms},
            ratios={"swerex_session/orchard_session": ratio(swerex.p99_ms, ours.p99_ms)}),
    ]


def _succeeded(result) -> None:
    """A failing command would be timed as fast as a working one: every call must really run it."""
    if result.exit_code != 0:
        raise RuntimeError(f"`{COMMAND}` failed in Orchard: {result!r}")


async def _async_succeeded(awaitable) -> None:
    _succeeded(await awaitable)


@asynccontextmanager
async def _created(orchard):
    async with await orchard.create() as sandbox:
        yield sandbox


def run(ctx: BenchContext) -> Findings:
    warmup, runs = ctx.pick(30, 5), ctx.pick(300, 40)
    rounds = ctx.pick(30, 2)
    # The runner is entered first so it closes last; everything else closes in reverse order of opening.
    with ExitStack() as stack:
        runner = stack.enter_context(asyncio.Runner())
        floor = stack.enter_context(FloorClient(stack.enter_context(floor_server()).url))
        swerex = remote_runtime(stack.enter_context(swerex_server()))
        enter_async(stack, runner, swerex_session(swerex))

        orchard = stack.enter_context(embedded_orchard())
        sandbox = stack.enter_context(orchard.create())
        session = sandbox.shell("bench")

        async_orchard = enter_async(stack, runner, embedded_async_orchard())
        async_sandbox = enter_async(stack, runner, _created(async_orchard))
        async_session = runner.run(async_sandbox.shell("bench"))

        blocks = {
            ORCHARD_SYNC: sync_block(lambda: _succeeded(sandbox.exec(COMMAND))),
            ORCHARD_ASYNC: async_block(runner, lambda: _async_succeeded(async_sandbox.exec(COMMAND))),
            SESSION_SYNC: sync_block(lambda: _succeeded(session.run(COMMAND))),
            SESSION_ASYNC: async_block(runner, lambda: _async_succeeded(async_session.run(COMMAND))),
            FLOOR: sync_block(lambda: floor.exec(COMMAND)),
            SWEREX_EXEC: async_block(runner, lambda: swerex_execute(swerex, COMMAND)),
            SWEREX_SESSION: async_block(runner, lambda: swerex_session_run(swerex, COMMAND)),
        }
        with Progress(console=ctx.console, transient=True) as progress:
            task = progress.add_task(f"exec round trips ({len(blocks)} methods × {runs})", total=rounds)
            stats = measure_interleaved(blocks, warmup=warmup, runs=runs, rounds=rounds,
                                        on_round=lambda done: progress.update(task, completed=done))

    rows = (_exec_rows("sync SDK", stats[ORCHARD_SYNC], stats[FLOOR], stats[SWEREX_EXEC])
            + _exec_rows("async SDK", stats[ORCHARD_ASYNC], stats[FLOOR], stats[SWEREX_EXEC])
            + _session_rows("sync SDK", stats[SESSION_SYNC], stats[SWEREX_SESSION])
            + _session_rows("async SDK", stats[SESSION_ASYNC], stats[SWEREX_SESSION]))
    return Findings(rows=rows, latencies=stats, notes=[
        "Orchard runs `true` inside a sandbox (bubblewrap, own namespaces) through its agent over a Unix "
        "socket; the floor and SWE-ReX run it on the host, unisolated, over TCP loopback.",
        "SWE-ReX's client opens a new connection per call (aiohttp with `force_close=True`) and uvicorn logs "
        "every request; its bash session (pexpect) waits `delaybeforesend` = 50 ms before each of the two "
        "lines it sends per command (the command, then `echo $?`).",
    ])


MEASUREMENT = Measurement(
    name="exec_latency",
    title="Exec round trip",
    method=(f"Round trip of running `{COMMAND}` (a string, so under `/bin/sh -c` everywhere), p50/p99 over "
            "300 calls after 30 warm-ups per method, made in 30 interleaved rounds of 10 so that load from "
            "elsewhere falls on all methods alike. One sandbox per client, reused; the session rows use "
            "a persistent shell (`sb.shell(\"bench\").run(\"true\")`) against SWE-ReX's "
            "`run_in_session(BashAction(\"true\"))`."),
    run=run,
)
