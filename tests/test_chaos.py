"""Chaos: many create → exec → (file round trip) → delete cycles against a real `orchard serve` while
sandboxes' agents, namespace inits and bwrap monitors are SIGKILLed at random and the orchestrator itself
is SIGKILLed and restarted (re-adopting what runs). Afterwards nothing may be left: no process, mount,
cgroup, directory or store row of any sandbox of the run (for Kubernetes: no Pod, Secret or
NetworkPolicy of the run's instance), no sampled moment may have had more sandboxes than the bound, every
error the clients saw must be one of Orchard's typed errors with a clear message, and no call may hang.

How long it runs (see docs/robustness.md):
- ORCHARD_CHAOS_CYCLES: cycles in all (default 2000 local, 40 Kubernetes);
- ORCHARD_CHAOS_SECONDS: at most this long under chaos (default 75 local, 90 Kubernetes); the run ends
  at whichever comes first;
- ORCHARD_CHAOS_WORKERS: clients at once (default 8 local, 4 Kubernetes);
- ORCHARD_CHAOS_SEED: the seed of every random choice (default 13), printed with the results."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import time
from collections import Counter
from pathlib import Path

import pytest

from orchard.sandbox.client import AsyncOrchard
from tests.chaos_clients import Tally, run_workers
from tests.chaos_rig import (MARK, ChaosServer, Sampler, kill_in_local_sandbox, local_footprint,
                             local_sandbox_count, new_mark, store_states, wait_until_empty)
from tests.running_server import remove_live_sandboxes

# Fewer places than clients, so creates wait at the cap (and some get 429) all the time.
CAP_BELOW_WORKERS = 2
ORCHESTRATOR_KILL_EVERY_S = 12.0  # on average; each restart costs the clients a few seconds of outage
CLIENT_TIMEOUT_S = 30.0


def _setting(name: str, default: float) -> float:
    value = os.environ.get(f"ORCHARD_CHAOS_{name}")
    return float(value) if value else default


async def _chaos(server: ChaosServer, home: Path, rng: random.Random, stop_at: float, kills: Counter) -> None:
    """Until `stop_at`: every 50-400 ms SIGKILL a part of some sandbox; every ~12 s the orchestrator."""
    next_crash = time.monotonic() + ORCHESTRATOR_KILL_EVERY_S * rng.uniform(0.3, 1.0)
    while time.monotonic() < stop_at:
        await asyncio.sleep(rng.uniform(0.05, 0.4))
        if time.monotonic() >= next_crash:
            await asyncio.to_thread(server.kill)
            kills["orchestrator"] += 1
            await asyncio.sleep(rng.uniform(0.0, 1.0))  # down a while: clients meet a closed port
            await asyncio.to_thread(server.start)
            next_crash = time.monotonic() + ORCHESTRATOR_KILL_EVERY_S * rng.uniform(0.5, 1.5)
        else:
            what = rng.choice(("agent", "agent", "init", "monitor"))
            if await asyncio.to_thread(kill_in_local_sandbox, home, rng, what):
                kills[what] += 1


@pytest.mark.slow
async def test_chaos_on_the_local_backend_leaves_nothing(tmp_path):
    cycles = int(_setting("CYCLES", 2000))
    seconds = _setting("SECONDS", 75)
    workers = int(_setting("WORKERS", 8))
    seed = int(_setting("SEED", 13))
    home, mark, key = tmp_path, new_mark(), secrets.token_urlsafe(16)
    cap = max(1, workers - CAP_BELOW_WORKERS)
    server = ChaosServer(home, key, options={"caps": {"max_sandboxes": cap, "wait_s": 2.0}})
    tally, kills = Tally(), Counter()
    # A created sandbox whose answer never reached its client (the orchestrator died first, and the
    # SDK's retries with the same idempotency key ran out) is reaped by its heartbeat timeout.
    spec = {"env": {MARK: mark}, "labels": {"chaos": mark}, "timeout_s": 600, "heartbeat_timeout_s": 10}
    rng = random.Random(seed)
    try:
        server.start()
        started = time.monotonic()
        stop_at = started + seconds
        with Sampler(lambda: local_sandbox_count(home)) as sampler:
            await asyncio.gather(
                run_workers(lambda: AsyncOrchard(server.url, key, timeout=CLIENT_TIMEOUT_S), spec,
                            workers=workers, cycles=cycles, stop_at=stop_at, seed=seed, tally=tally),
                _chaos(server, home, rng, stop_at, kills))
            elapsed = time.monotonic() - started
            # One last crash, then the next orchestrator re-adopts what runs and the sweep deletes it all.
            server.kill()
            server.start()
            async with AsyncOrchard(server.url, key, timeout=CLIENT_TIMEOUT_S) as orch:
                for info in await orch.list():
                    await orch.delete(info.id)
                left = [f"{i.id}={i.state}" for i in await orch.list()]
            server.stop()
        print(f"\nchaos seed {seed}: {elapsed:.0f} s, {workers} workers, kills {dict(kills)}, "
              f"orchestrator starts {server.starts}; peak {sampler.peak} sandboxes on the host, cap {cap} "
              f"({len(sampler.samples)} samples)\n{tally.summary()}")
        assert left == []
        ids = tally.seen_ids | set(store_states(home))
        footprint = wait_until_empty(lambda: local_footprint(home, mark, ids), timeout_s=15)
        assert footprint.empty, f"left behind: {footprint.describe()}"

        assert not tally.hangs, tally.hangs[:5]
        assert not tally.unexpected, tally.unexpected[:5]
        assert not tally.wrong_answers, tally.wrong_answers[:5]
        assert not sampler.errors, sampler.errors[:5]
        # The cap held at every sample, counted from the host: directories exist from before anything
        # of a sandbox runs until after all of it is gone.
        assert sampler.peak <= cap, f"{sampler.peak} sandboxes on the host at once, over the cap of {cap}"
        # The chaos really happened, and the clients really worked through it.
        assert kills["orchestrator"] >= 1 and kills["agent"] and kills["init"] and kills["monitor"], kills
        assert tally.cycles_ok > tally.cycles_failed, tally.summary()
        assert "adopted ['sb-" in server.tail(10**7), "no restart re-adopted a running sandbox"
    finally:
        server.kill()
        await asyncio.to_thread(remove_live_sandboxes, home)


async def test_the_orphan_check_sees_every_part_of_a_live_sandbox(tmp_path):
    """The footprint is not vacuous: a running sandbox shows in every host-side part it checks, and a
    deleted one in none."""
    from orchard.sandbox.server.service import SandboxService

    mark = new_mark()
    service = SandboxService.embedded(tmp_path)
    await service.start()
    try:
        info = await service.create({"env": {MARK: mark}})
        found = local_footprint(tmp_path, mark, {info.id})
        assert len(found.processes) >= 3  # bwrap's monitor, the namespace init, the agent (and its init)
        assert len(found.dirs) == 2 and found.records == [f"{info.id}=ready"]
        assert sorted(found.cgroups) == sorted(service.store.get(info.id).backend.handle["cgroups"])
        await service.delete(info.id)
        assert wait_until_empty(lambda: local_footprint(tmp_path, mark, {info.id}), timeout_s=10).empty
    finally:
        await service.stop(delete_all=True)
