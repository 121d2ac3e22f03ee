"""Hard caps and idempotency keys (issue 13 part 4): what admission costs a create, and a burst under a cap.

- create→ready through an orchestrator with every cap set (live sandboxes, per owner, create rate; all far
  above what the run reaches) and an idempotency key on each create, against one with none, interleaved;
- a burst of create/delete cycles at once under a cap: the most live sandboxes seen (the store's count and
  the backend's own list, sampled every 10 ms) and the cycles' wall time against the same burst uncapped."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

from rich.progress import Progress

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.client import Orchard
from orchard.sandbox.server.admission import CreateCaps
from orchard.sandbox.server.service import SandboxService

# Every cap set, none reached: what the admission transaction and the key cost by themselves.
ALL_CAPS = CreateCaps(max_sandboxes=10_000, max_sandboxes_per_owner=10_000, max_creates_per_s=10_000.0)
ADMISSION_OVERHEAD_MAX = 1.10
CAPPED, UNCAPPED = "with caps and an idempotency key", "no caps, no key"


@contextmanager
def _orchard(caps: CreateCaps | None) -> Iterator[Orchard]:
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as home, Orchard(home=home, caps=caps) as orchard:
        yield orchard


def _time_create(orchard: Orchard, key: str | None) -> float:
    started = time.perf_counter()
    sandbox = orchard.create(idempotency_key=key)
    elapsed = time.perf_counter() - started
    sandbox.close()
    return elapsed


async def _burst(cycles: int, cap: int | None) -> tuple[float, int, int]:
    """(wall s, most live in the store, most live in the backend) for `cycles` create/delete at once."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as home:
        service = SandboxService.embedded(home, caps=CreateCaps(max_sandboxes=cap, wait_s=600))
        await service.start()
        peak_store = peak_backend = 0
        running = True

        async def sample() -> None:
            nonlocal peak_store, peak_backend
            while running:
                peak_store = max(peak_store, (await service.stats()).live)
                peak_backend = max(peak_backend, len(await service.backend.list_live()))
                await asyncio.sleep(0.01)

        async def cycle() -> None:
            info = await service.create(SandboxSpec())
            await service.delete(info.id)

        sampler = asyncio.create_task(sample())
        try:
            started = time.perf_counter()
            await asyncio.gather(*(cycle() for _ in range(cycles)))
            wall = time.perf_counter() - started
        finally:
            running = False
            await sampler
            await service.stop(delete_all=True)
        return wall, peak_store, peak_backend


def run(ctx: BenchContext) -> Findings:
    count, warmup, cycles, cap = ctx.pick(30, 5), ctx.pick(3, 1), ctx.pick(40, 10), ctx.pick(5, 3)
    capped, uncapped = [], []
    with _orchard(ALL_CAPS) as with_caps, _orchard(None) as without, \
            Progress(console=ctx.console, transient=True) as progress:
        task = progress.add_task(f"create→ready × {count}, with and without caps", total=warmup + count)
        for index in range(warmup + count):
            with_key = _time_create(with_caps, f"bench-{uuid.uuid4().hex}")
            plain = _time_create(without, None)
            if index >= warmup:
                capped.append(with_key)
                uncapped.append(plain)
            progress.update(task, advance=1)
    burst_wall, peak_store, peak_backend = asyncio.run(_burst(cycles, cap))
    free_wall, free_store, _ = asyncio.run(_burst(cycles, None))
    stats = {CAPPED: LatencyStats.from_seconds(capped), UNCAPPED: LatencyStats.from_seconds(uncapped)}
    ours, peer = stats[CAPPED], stats[UNCAPPED]
    return Findings(latencies=stats, rows=[
        Row(metric="create→ready p50 through admission (caps + idempotency key)", unit="ms", ours=ours.p50_ms,
            peers={UNCAPPED: peer.p50_ms}, ratios={"caps/none": ratio(ours.p50_ms, peer.p50_ms)},
            targets=[Target(on="caps/none", op="<=", limit=ADMISSION_OVERHEAD_MAX)]),
        Row(metric=f"most live sandboxes, {cycles} create/delete cycles at once under a cap of {cap}",
            unit="sandboxes", ours=float(max(peak_store, peak_backend)),
            peers={"uncapped (store)": float(free_store)}, targets=[Target(op="<=", limit=float(cap))]),
        Row(metric=f"wall time of {cycles} create/delete cycles at once", unit="s", ours=burst_wall,
            peers={"uncapped": free_wall}, ratios={f"cap {cap}/uncapped": ratio(burst_wall, free_wall)}),
    ], notes=[
        "Admission is one SQLite write transaction per create (count the live sandboxes, in all and of the "
        "owner, take a token of the create rate, record the idempotency key, insert the record), so that "
        "no concurrent create, nor another orchestrator on the same store, can overshoot a cap.",
        "The burst's peak is the larger of the store's live count and the local backend's own list of "
        "running sandboxes, sampled every 10 ms while the cycles run.",
    ])


MEASUREMENT = Measurement(
    name="caps",
    title="Hard caps: admission cost and a burst under a cap",
    method=("Embedded orchestrators on the local backend. Creates one at a time alternate between one with "
            "every cap set (none reached) and a fresh idempotency key per create, and one with neither; 30 "
            "each after 3 warm-ups, each sandbox deleted before the next. Then 40 create/delete cycles start "
            "at once under a cap of 5 live sandboxes, and again uncapped."),
    run=run,
)
