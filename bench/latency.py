"""Round-trip timing, interleaved: every method gets its warm-ups, then the runs are made in rounds (a
block of each method per round), so load from anything else on the machine falls on all methods alike
rather than on whichever happened to run during it."""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager, ExitStack
from typing import Awaitable, Callable, TypeVar

from bench.stats import LatencyStats

T = TypeVar("T")
Block = Callable[[int], list[float]]  # runs the call k times, returns each duration in seconds


def sync_block(call: Callable[[], object]) -> Block:
    def block(k: int) -> list[float]:
        durations = []
        for _ in range(k):
            started = time.perf_counter()
            call()
            durations.append(time.perf_counter() - started)
        return durations

    return block


def echo_round_trips(conn, payload: bytes) -> Block:
    """Round trips of `payload` to an echo server on the kept connection `conn` (sent, then read back whole)."""
    def block(k: int) -> list[float]:
        durations = []
        for _ in range(k):
            started = time.perf_counter()
            conn.sendall(payload)
            received = 0
            while received < len(payload):
                received += len(conn.recv(65536))
            durations.append(time.perf_counter() - started)
        return durations

    return block


def async_block(runner: asyncio.Runner, call: Callable[[], Awaitable[object]]) -> Block:
    """Time inside the event loop so the cost of entering the loop is not counted per call."""

    async def timed(k: int) -> list[float]:
        durations = []
        for _ in range(k):
            started = time.perf_counter()
            await call()
            durations.append(time.perf_counter() - started)
        return durations

    return lambda k: runner.run(timed(k))


def enter_async(stack: ExitStack, runner: asyncio.Runner, manager: AbstractAsyncContextManager[T]) -> T:
    """Enter an async context manager on `runner` and have `stack` exit it there, in LIFO order with the
    sync ones: a client is then closed before the server it talks to is stopped."""
    value = runner.run(manager.__aenter__())
    stack.push(lambda *exc_info: runner.run(manager.__aexit__(*exc_info)))
    return value


def measure_interleaved(blocks: dict[str, Block], *, warmup: int, runs: int, rounds: int,
                        on_round: Callable[[int], None] | None = None) -> dict[str, LatencyStats]:
    """`warmup` untimed calls, then `runs` timed calls per method spread over `rounds` rounds."""
    if runs < rounds or rounds < 1:
        raise ValueError(f"need runs >= rounds >= 1, got runs={runs}, rounds={rounds}")
    for block in blocks.values():
        block(warmup)
    samples: dict[str, list[float]] = {name: [] for name in blocks}
    for index in range(rounds):
        size = runs // rounds + (1 if index < runs % rounds else 0)
        for name, block in blocks.items():
            samples[name] += block(size)
        if on_round is not None:
            on_round(index + 1)
    return {name: LatencyStats.from_seconds(values) for name, values in samples.items()}
