"""Chaos: many create → exec → (file round trip) → delete cycles against a real `orchard serve`, capped
below the number of clients, while sandboxes are killed underneath (local: SIGKILL of an agent, a pid
namespace init or a bwrap monitor; Kubernetes: a Pod deleted with grace 0) and the orchestrator itself is
SIGKILLed and restarted (re-adopting what runs). Afterwards nothing may be left: no process, mount,
cgroup, directory or live store row of any sandbox of the run (Kubernetes: no Pod, Secret or
NetworkPolicy of the run's backend instance); no sampled moment may have had more sandboxes than the cap;
every error the clients saw must be one of Orchard's typed errors with a clear message; no call may hang.

How long it runs (see docs/robustness.md):
- ORCHARD_CHAOS_CYCLES: sandboxes created and used in all (default 2000 local, 40 Kubernetes);
- ORCHARD_CHAOS_SECONDS: at most this long under chaos (default 75 local, 90 Kubernetes); the run ends
  at whichever comes first;
- ORCHARD_CHAOS_WORKERS: clients at once (default 8 local, 4 Kubernetes);
- ORCHARD_CHAOS_SEED: the seed of every random choice (default 13), printed with the results;
- ORCHARD_CHAOS_CRASH_EVERY_S: the mean time between orchestrator kills (default 12 local, 30 Kubernetes)."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from orchard.core.errors import CapacityExceeded
from orchard.sandbox.client import AsyncOrchard
from tests.chaos_clients import Tally, run_workers
from tests.chaos_rig import (FINISHED_STATES, MARK, ChaosServer, Footprint, Sampler, delete_random_pod, k8s_footprint, k8s_pod_names,
                             kill_in_local_sandbox, local_footprint, local_sandbox_count, new_mark, pool_claims,
                             store_states, wait_until_empty)
from tests.k8s_cluster import CLUSTER_SCRIPT, POD_PIDS_LIMIT, require_cluster
from tests.running_server import remove_live_sandboxes

# Fewer places than clients, so creates wait at the cap (and some get 429) all the time.
CAP_BELOW_WORKERS = 2
ORCHESTRATOR_KILL_EVERY_S = 12.0  # on average; each restart costs the clients a few seconds of outage
CLIENT_TIMEOUT_S = 30.0
K8S_IMAGE = "localhost/orchard-base:local"  # the dev cluster's busybox base (scripts/k8s/cluster.sh)


def _setting(name: str, default: float) -> float:
    value = os.environ.get(f"ORCHARD_CHAOS_{name}")
    return float(value) if value else default


@dataclass
class ChaosRun:
    """What one chaos run did and saw."""

    tally: Tally
    kills: Counter
    sampler: Sampler
    elapsed_s: float
    left_listed: list[str]  # sandboxes the orchestrator still listed after the final sweep

    def summary(self, seed: int, workers: int, cap: int, server: ChaosServer) -> str:
        return (f"\nchaos seed {seed}: {self.elapsed_s:.0f} s, {workers} workers, kills {dict(self.kills)}, "
                f"orchestrator starts {server.starts} ({', '.join(f'{t:.1f}' for t in server.start_s)} s); peak {self.sampler.peak} sandboxes, cap {cap} "
                f"({len(self.sampler.samples)} samples)\n{self.tally.summary()}\none of each:\n"
                f"{self.tally.example_messages()}")


async def _chaos(server: ChaosServer, kill_part: Callable[[random.Random], str | None], rng: random.Random,
                 stop_at: float, kills: Counter, crash_every_s: float, tally: Tally,
                 kill_every_cycles: tuple[int, int]) -> None:
    """Until `stop_at`: `kill_part` (returns what it killed, or None) once every few sandboxes handed out (a
    number drawn from `kill_every_cycles`: paced by the clients' progress, so a slow machine gets as much
    chaos per cycle as a fast one); every ~`crash_every_s` the orchestrator (SIGKILL, down for up to a
    second, then started again; 3 times in 10 killed once more while it starts)."""
    next_crash = time.monotonic() + crash_every_s * rng.uniform(0.3, 1.0)
    next_kill = rng.randint(*kill_every_cycles)
    while time.monotonic() < stop_at:
        await asyncio.sleep(rng.uniform(0.02, 0.1))
        if time.monotonic() >= next_crash:
            await asyncio.to_thread(server.kill)
            kills["orchestrator"] += 1
            await asyncio.sleep(rng.uniform(0.0, 1.0))  # down a while: clients meet a closed port
            if rng.random() < 0.3:  # killed again while it starts: mid-reconciliation, say
                server.start(wait=False)
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                await asyncio.to_thread(server.kill)
                kills["orchestrator starting"] += 1
            await asyncio.to_thread(server.start)
            next_crash = time.monotonic() + crash_every_s * rng.uniform(0.5, 1.5)
        elif len(tally.seen_ids) >= next_kill:
            what = await asyncio.to_thread(kill_part, rng)
            if what:
                kills[what] += 1
                next_kill = len(tally.seen_ids) + rng.randint(*kill_every_cycles)


async def _run_chaos(server: ChaosServer, specs: list[dict], *, kill_part: Callable[[random.Random], str | None],
                     footprint_of: Callable[[str], Footprint],
                     kill_every_cycles: tuple[int, int], hold_s: tuple[float, float] = (0.0, 0.0), count: Callable[[], int], sample_every_s: float,
                     crash_every_s: float, workers: int, cycles: int, seconds: float, seed: int) -> ChaosRun:
    """Clients and chaos together; then one last orchestrator crash with a sandbox running, which the
    restarted one must adopt, a sweep that deletes whatever is listed, and a graceful stop."""
    tally, kills, rng = Tally(), Counter(), random.Random(seed)
    server.start()
    await _pools_filled(server)
    started = time.monotonic()
    stop_at = started + seconds
    with Sampler(count, sample_every_s) as sampler:
        await asyncio.gather(
            run_workers(lambda: AsyncOrchard(server.url, server.api_key, timeout=CLIENT_TIMEOUT_S), specs,
                        workers=workers, cycles=cycles, stop_at=stop_at, seed=seed, tally=tally, hold_s=hold_s),
            _chaos(server, kill_part, rng, stop_at, kills, crash_every_s, tally, kill_every_cycles))
        elapsed = time.monotonic() - started
        survivor = await _create_survivor(server, specs[-1])
        seen = await asyncio.to_thread(footprint_of, survivor.id)  # the orphan checks see a live sandbox
        assert not seen.empty, f"the footprint of running sandbox {survivor.id} is empty"
        server.kill()
        server.start()
        async with AsyncOrchard(server.url, server.api_key, timeout=CLIENT_TIMEOUT_S) as orch:
            # Re-adopted: the same sandbox, ready, reachable with the token it was created with.
            assert (await orch.get(survivor.id)).state == "ready"
            async with await orch.connect(survivor.id) as sandbox:
                assert (await sandbox.exec("echo survived")).stdout == "survived\n"
            for info in await orch.list():
                await orch.delete(info.id)
            left = [f"{i.id}={i.state}" for i in await orch.list()]
        server.stop()
    return ChaosRun(tally, kills, sampler, elapsed, left)


async def _pools_filled(server: ChaosServer) -> None:
    """Wait until the server's warm pools hold their members. The clients outnumber the cap's places, and
    member starts yield to creates waiting there (by design: members never starve creates), so a pool
    refills only in lulls the chaos may never leave; the first creates must find members to claim."""
    async with AsyncOrchard(server.url, server.api_key, timeout=CLIENT_TIMEOUT_S) as orch:
        for pool in await orch.pool_status():
            await orch.wait_for_pool(pool.name, idle=pool.target, timeout=60)


async def _create_survivor(server: ChaosServer, spec: dict):
    """One sandbox made just before the last crash, which the next orchestrator must adopt. Sandboxes
    whose creates were answered to nobody may still hold the cap until their heartbeat timeout."""
    deadline = time.monotonic() + 90
    async with AsyncOrchard(server.url, server.api_key, timeout=CLIENT_TIMEOUT_S) as orch:
        while True:
            try:
                return await orch.create(**spec, detach=True)
            except CapacityExceeded:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)


def _check(run: ChaosRun, cap: int, expected_kills: tuple[str, ...]) -> None:
    """What every chaos run must show, whatever the backend."""
    assert run.left_listed == []
    assert not run.tally.hangs, run.tally.hangs[:5]
    assert not run.tally.unexpected, run.tally.unexpected[:5]
    assert not run.tally.wrong_answers, run.tally.wrong_answers[:5]
    assert not run.sampler.errors, run.sampler.errors[:5]
    assert run.sampler.peak <= cap, f"{run.sampler.peak} sandboxes at once, over the cap of {cap}"
    # The chaos really happened, and the clients really worked through it.
    assert all(run.kills[what] for what in expected_kills), run.kills
    # (creates fail by design while the orchestrator is down; most sandboxes handed out must be usable)
    assert run.tally.cycles_ok * 2 > len(run.tally.seen_ids), run.tally.summary()


def _must_show(found: Footprint, *parts: str) -> Footprint:
    """`found` if each of `parts` holds something; an empty footprint otherwise (the caller fails)."""
    return found if all(getattr(found, part) for part in parts) else Footprint()


def _kill_in_local_sandbox(home, rng: random.Random) -> str | None:
    what = rng.choice(("agent", "agent", "init", "monitor"))
    return what if kill_in_local_sandbox(home, rng, what) else None


@pytest.mark.slow
async def test_chaos_on_the_local_backend_leaves_nothing(tmp_path):
    cycles, seconds = int(_setting("CYCLES", 2000)), _setting("SECONDS", 75)
    workers, seed = int(_setting("WORKERS", 8)), int(_setting("SEED", 13))
    home, mark = tmp_path, new_mark()
    cap = max(1, workers - CAP_BELOW_WORKERS)
    # Every create has the pool's template (a default spec: env, labels and TTLs are set per claim), so it
    # is claimed from the pool when a member is started, else made cold; members count against the cap.
    pool = {"name": "chaos", "min_ready": 2, "max_size": 3, "refill_parallel": 2}
    server = ChaosServer(home, secrets.token_urlsafe(16),
                         options={"caps": {"max_sandboxes": cap, "wait_s": 2.0}, "pools": {"pools": [pool]}})
    # A created sandbox whose answer never reached its client (the orchestrator died first, and the
    # SDK's retries with the same idempotency key ran out) is reaped by its heartbeat timeout.
    spec = {"env": {MARK: mark}, "labels": {"chaos": mark}, "timeout_s": 600, "heartbeat_timeout_s": 10}
    # Every second client's sandboxes (made cold: another template) have a network allowlist: a veth pair
    # and nftables rules each, which must go with them however they die.
    allowlisted = {**spec, "network": {"mode": "allowlist", "allow": ["192.0.2.7:443"]}}
    try:
        run = await _run_chaos(
            server, [spec, allowlisted], kill_part=lambda rng: _kill_in_local_sandbox(home, rng), kill_every_cycles=(1, 6),
            footprint_of=lambda i: _must_show(local_footprint(home, mark, {i}), "processes", "cgroups", "dirs",
                                              "network"),
            # Directories exist from before anything of a sandbox runs until after all of it is gone.
            count=lambda: local_sandbox_count(home), sample_every_s=0.05,
            crash_every_s=_setting("CRASH_EVERY_S", ORCHESTRATOR_KILL_EVERY_S), workers=workers, cycles=cycles, seconds=seconds, seed=seed)
        print(run.summary(seed, workers, cap, server) + f"\nclaimed from the pool: {pool_claims(home)}")
        ids = run.tally.seen_ids | set(store_states(home))
        footprint = wait_until_empty(lambda: local_footprint(home, mark, ids), timeout_s=15)
        assert footprint.empty, f"left behind: {footprint.describe()}"
        _check(run, cap, ("orchestrator", "agent", "init", "monitor"))
        assert pool_claims(home) > 0, "no create was claimed from the warm pool"
    finally:
        server.kill()
        await asyncio.to_thread(remove_live_sandboxes, home)


@pytest.mark.slow
@pytest.mark.k8s
async def test_chaos_on_kubernetes_leaves_nothing(tmp_path):
    """Pods deleted at once (grace 0) at random and the orchestrator SIGKILLed and restarted; afterwards no
    Pod, Secret or NetworkPolicy of the run's backend instance is left, and no store row but deleted ones."""
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    from orchard.sandbox.backends.kubernetes.images import import_injector_image

    kubeconfig = require_cluster()
    agent_image = import_injector_image(CLUSTER_SCRIPT)
    cycles, seconds = int(_setting("CYCLES", 40)), _setting("SECONDS", 90)
    workers, seed = int(_setting("WORKERS", 4)), int(_setting("SEED", 13))
    namespace, instance = f"orchard-chaos-{secrets.token_hex(3)}", f"c{secrets.token_hex(4)}"
    cap = max(1, workers - 1)
    env = {"KUBECONFIG": kubeconfig, "ORCHARD_K8S_NAMESPACE": namespace, "ORCHARD_K8S_INSTANCE": instance,
           "ORCHARD_K8S_AGENT_IMAGE": agent_image, "ORCHARD_K8S_IMAGE_PULL_POLICY": "Never",
           "ORCHARD_K8S_POD_PIDS_LIMIT": str(POD_PIDS_LIMIT)}
    server = ChaosServer(tmp_path, secrets.token_urlsafe(16), backend="kubernetes", env=env,
                         options={"caps": {"max_sandboxes": cap, "wait_s": 30.0}})
    # An allowlist gives every sandbox a NetworkPolicy of its own: one more object that must not leak.
    spec = {"image": K8S_IMAGE, "cpu": 0.05, "memory_mb": 64, "labels": {"chaos": instance}, "timeout_s": 600,
            "heartbeat_timeout_s": 30, "network": {"mode": "allowlist", "allow": ["192.0.2.7:443"]}}
    try:
        run = await _run_chaos(
            server, [spec],
            kill_part=lambda rng: "pod" if delete_random_pod(kubeconfig, namespace, instance, rng) else None,
            kill_every_cycles=(1, 4), hold_s=(0.5, 3.0),  # a Pod starts in seconds: hold it, or it is only
            # ever killed while starting
            footprint_of=lambda i: _must_show(k8s_footprint(kubeconfig, namespace, instance), "pods", "secrets",
                                              "network_policies"),
            count=lambda: len(k8s_pod_names(kubeconfig, namespace, instance)), sample_every_s=0.25,
            crash_every_s=_setting("CRASH_EVERY_S", 30.0), workers=workers, cycles=cycles, seconds=seconds, seed=seed)
        print(run.summary(seed, workers, cap, server))
        footprint = wait_until_empty(lambda: k8s_footprint(kubeconfig, namespace, instance), timeout_s=60)
        assert footprint.empty, f"left behind: {footprint.describe()}"
        assert [i for i, state in store_states(tmp_path).items() if state not in FINISHED_STATES] == []
        _check(run, cap, ("orchestrator", "pod"))
    finally:
        server.kill()
        api = load_api_client(kubeconfig)
        try:  # Pods first, at once: the namespace controller would wait for their grace periods
            core = client.CoreV1Api(api)
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            core.delete_namespace(namespace)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
        finally:
            api.close()


async def test_the_orphan_check_sees_every_part_of_a_live_sandbox(tmp_path):
    """The footprint is not vacuous: a running sandbox shows in every host-side part it checks, and a
    deleted one in none; the spare the backend makes after a create (local/spares.py, with the zygote)
    shows while the orchestrator runs and is gone once it stops."""
    from orchard.sandbox.backends.local.spares import SPARE_INFIX
    from orchard.sandbox.server.service import SandboxService

    def without_spares(found: Footprint) -> Footprint:
        spares = [g for g in found.cgroups if f"-{SPARE_INFIX}" in g]
        in_spares = {pid for g in spares for pid in Path(g, "cgroup.procs").read_text().split()}
        return found.model_copy(update={"cgroups": [g for g in found.cgroups if g not in spares],
                                        "processes": [p for p in found.processes if p.split()[0] not in in_spares]})

    mark = new_mark()
    service = SandboxService.embedded(tmp_path)
    await service.start()
    stopped = False
    try:
        info = await service.create({"env": {MARK: mark}})
        found = local_footprint(tmp_path, mark, {info.id})
        assert len(found.processes) >= 3  # bwrap's monitor, the namespace init, the agent (and its init)
        assert len(found.dirs) == 2 and found.records == [f"{info.id}=ready"]
        assert sorted(without_spares(found).cgroups) == sorted(service.store.get(info.id).backend.handle["cgroups"])
        await service.delete(info.id)
        assert wait_until_empty(lambda: without_spares(local_footprint(tmp_path, mark, {info.id})),
                                timeout_s=10).empty
        if os.geteuid() == 0:  # with the zygote: the next create's spare, in groups of its own
            deadline = time.monotonic() + 10
            while not any(f"-{SPARE_INFIX}" in g for g in local_footprint(tmp_path, mark, set()).cgroups):
                assert time.monotonic() < deadline, "no spare was made after the create"
                await asyncio.sleep(0.05)
        await service.stop(delete_all=True)
        stopped = True
        assert local_footprint(tmp_path, mark, {info.id}).empty
    finally:
        if not stopped:
            await service.stop(delete_all=True)


def test_docs_robustness_shows_real_settings_tests_and_output():
    """docs/robustness.md: the `chaos-run` lines set only the variables this module reads, and their `-k`
    selects one test here (shape only: the runs take minutes); the `chaos-output` lines have the shape the
    summary prints, with error kinds that are Orchard's error types."""
    import re
    import shlex

    from orchard.core import errors
    from tests import doc_blocks

    page = doc_blocks.ROOT / "docs" / "robustness.md"
    source = Path(__file__).read_text()
    (_, runs, _), = doc_blocks.of_kind(page, "chaos-run")
    for line in runs.strip().splitlines():
        words = shlex.split(line)
        settings = [w.split("=", 1)[0] for w in words if re.fullmatch(r"[A-Z0-9_]+=\S+", w)]
        for name in settings:  # ORCHARD_CHAOS_* read here, ORCHARD_K8S by tests/k8s_cluster.py
            assert (f'_setting("{name.removeprefix("ORCHARD_CHAOS_")}"' in source if name.startswith("ORCHARD_CHAOS_")
                    else name == "ORCHARD_K8S"), line
        command = words[len(settings):]
        assert command[:3] == ["python", "-m", "pytest"] and "tests/test_chaos.py" in command, line
        selector = command[command.index("-k") + 1]
        assert len(re.findall(rf"^async def test_chaos_\w*{selector}\w*\(", source, re.M)) == 1, line
    (_, output, _), = doc_blocks.of_kind(page, "chaos-output")
    first, tally, *kinds = output.strip().splitlines()
    assert first.startswith("chaos seed ") and " workers, kills {" in first
    assert re.fullmatch(r"cycles ok \d+, failed \d+, sandboxes \d+; create p50 [\d.]+ s, max [\d.]+ s \(sb-\w+\)",
                        tally)
    for line in kinds:
        kind = re.fullmatch(r" +\d+ x (\w+): .+", line).group(1)
        assert issubclass(getattr(errors, kind), errors.OrchardError), line


async def test_a_create_interrupted_by_a_crash_frees_its_idempotency_key(tmp_path):
    """The remote SDK retries a create whose connection broke (the orchestrator died mid-create) with the
    same idempotency key. The interrupted create never made a sandbox anyone got, and the next orchestrator
    removes it; the retry must then create one, as it does after a create that failed in-process (whose
    record, and key, are removed)."""
    from orchard.core.sandbox import SandboxInfo, SandboxSpec
    from orchard.sandbox.server.models import SandboxRecord
    from orchard.sandbox.server.service import SandboxService, new_sandbox_id

    first = SandboxService.embedded(tmp_path, ephemeral=False)
    await first.start()
    spec, now = SandboxSpec(), time.time()
    info = SandboxInfo(id=new_sandbox_id(), state="creating", spec=spec, backend="local", token="t" * 32,
                       created_at=now, expires_at=now + spec.timeout_s, last_heartbeat=now)
    # What a create does before the backend makes anything: its record, bound to the key. Then its
    # orchestrator is gone (stopped counts as dead, like a killed one).
    await first.admission.admit(SandboxRecord(info=info, service_id=first.me.id), idempotency_key="k1")
    await first.stop()
    second = SandboxService.embedded(tmp_path, ephemeral=False)
    report = await second.start()
    try:
        assert report.orphans_removed == [info.id]
        retried = await second.create(spec, idempotency_key="k1")
        assert retried.state == "ready" and retried.id != info.id
    finally:
        await second.stop(delete_all=True)
