"""Measurement: warm pools (docs/pools.md). Embedded, on the local backend: a claim from a full pool
(create→ready of a spec with the pool's template) against a cold create→ready in the same run; creates a
second sustained while the pool refills; memory (PSS) per idle member. On Kubernetes (when a cluster
answers, as in bench/k8s.py): a burst of claims from a full pool against cold create→Ready, with a few
creates more than the pool holds (they find it drained and start cold in the same burst)."""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats

CLAIM_P50_MS, CREATES_PER_S, K8S_CLAIM_P99_MS = 5.0, 40.0, 500.0
# Untimed pause before each cold create: a create right after another one finds the kernel's cgroup
# migration lock still in its slow mode and skips the RCU grace period (~8 ms here) that a create in a
# program doing anything in between pays (bench/create_ready.py's notes).
COLD_GAP_S = 0.1
CLAIM, COLD = "claim from a pool", "cold create→ready"
K8S_CLAIM, K8S_COLD, K8S_DRAINED = "k8s claim (burst)", "k8s cold create→Ready", "k8s create, pool drained"
K8S_IMAGE = "localhost/orchard-base:local"


def run(ctx: BenchContext) -> Findings:
    findings = asyncio.run(_embedded(ctx))
    try:
        k8s = _kubernetes(ctx)
    except Exception as e:  # keep the embedded figures
        findings.notes.append(f"Kubernetes part failed: {type(e).__name__}: {e}")
        return findings
    findings.rows.extend(k8s.rows)
    findings.notes.extend(k8s.notes)
    findings.latencies.update(k8s.latencies)
    return findings


async def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(0.01)


async def _embedded(ctx: BenchContext) -> Findings:
    from orchard.core.pool import PoolSpec
    from orchard.core.sandbox import SandboxSpec
    from orchard.sandbox.server.service import SandboxService

    size, cold_n, window_s = ctx.pick(40, 10), ctx.pick(20, 5), ctx.pick(10.0, 3.0)
    pooled, cold = SandboxSpec(workdir="/pooled"), SandboxSpec(workdir="/cold")
    with tempfile.TemporaryDirectory(prefix="orchard-bench-pools-") as home:
        service = SandboxService.embedded(Path(home), pools=[PoolSpec(name="bench", spec=pooled, min_ready=size,
                                                                      max_size=size, refill_parallel=4)])
        try:
            await service.start()
            ctx.console.print(f"filling a pool of {size}")
            await _until(lambda: service.pools.status()[0].idle == size, 300, "filling the pool")
            await asyncio.sleep(0.5)
            members = [r.backend.handle.get("pid") for r in service.store.list(states=("ready",)) if r.backend]
            pss_mb = sum(_tree_pss_mb(pid) for pid in members if pid) / max(len(members), 1)
            # Claims one at a time from the full pool; refilling is paused (target 0) so that it does not
            # compete with them: this is the claim itself.
            service.pools.pools["bench"].target = 0
            claims, claimed_ids = [], []
            for _ in range(size):
                started = time.perf_counter()
                info = await service.create(pooled.model_copy(update={"env": {"K": "v"}}))
                claims.append(time.perf_counter() - started)
                assert info.pool is not None and info.pool.claimed, info.pool
                claimed_ids.append(info.id)
            await asyncio.gather(*(service.delete(sid) for sid in claimed_ids))
            colds = []
            for _ in range(cold_n):
                await asyncio.sleep(COLD_GAP_S)
                started = time.perf_counter()
                info = await service.create(cold)
                colds.append(time.perf_counter() - started)
                await service.delete(info.id)
            # Sustained: 8 clients create and delete for `window_s` while the pool refills behind them.
            service.pools.pools["bench"].target = size
            await _until(lambda: service.pools.status()[0].idle == size, 300, "refilling the pool")
            done = await _sustained(service, pooled, window_s, clients=8)
            status = service.pools.status()[0]
        finally:
            await service.stop(delete_all=True)
    claim, cold_stats = LatencyStats.from_seconds(claims), LatencyStats.from_seconds(colds)
    rows = [
        Row(metric="claim p50 (create→ready from a pool)", unit="ms", ours=claim.p50_ms, peers={COLD: cold_stats.p50_ms},
            ratios={"cold/claim": ratio(cold_stats.p50_ms, claim.p50_ms)},
            targets=[Target(op="<=", limit=CLAIM_P50_MS)]),
        Row(metric="claim p99", unit="ms", ours=claim.p99_ms, peers={COLD: cold_stats.p99_ms}),
        Row(metric=f"creates a second, sustained {window_s:g} s, pool of {size} refilling", unit="/s",
            ours=done["rate"], targets=[Target(op=">=", limit=CREATES_PER_S)]),
        Row(metric="of those, claimed from the pool", unit="%", ours=100.0 * done["claimed"] / max(done["count"], 1)),
        Row(metric="memory per idle pooled sandbox (PSS of its processes)", unit="MB", ours=pss_mb),
    ]
    notes = [f"Claims: {size} creates one at a time from a full pool (refill paused while timed), each with an "
             "env (the agent's POST /claim: fresh token + env, one record write). Cold: the same service, a spec "
             "of another template, each after a 0.1 s pause (so that it pays the kernel's wait at the cgroup move as a lone create does: bench/create_ready.py's notes). Sustained: 8 clients create in a loop (each sandbox deleted in the background); the pool (refill_parallel 4) "
             f"refills behind them; after the window: {status.claims} claims, {status.misses} misses in all.",
             "Memory: the proportional set size (PSS, shared pages split among their users) of every process of "
             "an idle member (bubblewrap, the agent), averaged over the pool; MB = 10^6 bytes."]
    return Findings(rows=rows, notes=notes, latencies={CLAIM: claim, COLD: cold_stats})


async def _sustained(service, spec, window_s: float, clients: int) -> dict:
    count = claimed = 0
    deletes: list[asyncio.Task] = []
    deadline = time.monotonic() + window_s

    async def client() -> None:
        nonlocal count, claimed
        while time.monotonic() < deadline:
            info = await service.create(spec)
            count += 1
            claimed += bool(info.pool and info.pool.claimed)
            deletes.append(asyncio.create_task(service.delete(info.id)))  # deleting is not the create's cost

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - started
    await asyncio.gather(*deletes)
    return {"rate": count / elapsed, "count": count, "claimed": claimed}


def _tree_pss_mb(root: int) -> float:
    """PSS of `root` and every process below it, in MB (10^6 bytes)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total_kib, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total_kib += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except OSError:
            continue
    return total_kib * 1024 / 1e6


def _kubernetes(ctx: BenchContext) -> Findings:
    from bench.k8s import CLUSTER_SCRIPT, _kubeconfig
    try:
        from orchard.sandbox.backends.kubernetes.client import probe_cluster
    except ImportError as e:
        return Findings(rows=[], notes=[f"Kubernetes part skipped: the kubernetes client is not installed ({e})."])
    kubeconfig = _kubeconfig()
    reason = "no kubeconfig" if kubeconfig is None else probe_cluster(kubeconfig)
    if reason:
        return Findings(rows=[], notes=[f"Kubernetes part skipped: no cluster ({reason}); start the dev cluster "
                                        "(`make k8s-up`) and run `python -m bench.run --only pools`."])
    agent_image = os.environ.get("ORCHARD_K8S_AGENT_IMAGE")
    if not agent_image:
        from orchard.sandbox.backends.kubernetes.images import import_injector_image
        agent_image = import_injector_image(CLUSTER_SCRIPT)
    return asyncio.run(_k8s(ctx, kubeconfig, agent_image))


async def _k8s(ctx: BenchContext, kubeconfig: str, agent_image: str) -> Findings:
    from orchard.core.pool import PoolSpec
    from orchard.core.sandbox import SandboxSpec
    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    from orchard.sandbox.server.service import SandboxService
    from orchard.sandbox.server.store import SandboxStore

    burst, extra, cold_n = ctx.pick(100, 10), ctx.pick(5, 2), ctx.pick(5, 2)  # the node takes 110 Pods
    # No CPU or memory limit: a Pod limited to a sliver of a CPU answers its claim only as fast as CFS lets
    # it (a 10m limit made claims take ~0.3 s), and requests would not let 100 fit on one node.
    spec = SandboxSpec(image=K8S_IMAGE, max_processes=None)
    backend = KubernetesBackend(namespace="orchard-bench", instance=f"pool{secrets.token_hex(3)}",
                                agent_image=agent_image, image_pull_policy="Never", kubeconfig=kubeconfig)
    pool = PoolSpec(name="k8s", spec=spec, min_ready=burst, max_size=burst, refill_parallel=16)
    service = SandboxService(backend, SandboxStore(":memory:"), pools=[pool])
    try:
        await service.start()
        ctx.console.print(f"filling a Kubernetes pool of {burst}")
        fill_started = time.monotonic()
        await _until(lambda: service.pools.status()[0].idle == burst, 900, "filling the Kubernetes pool")
        fill_s = time.monotonic() - fill_started
        service.pools.pools["k8s"].target = 0  # no refill during the burst
        # The burst asks for `extra` more than the pool holds: those find it drained and start cold.
        made = await asyncio.gather(*(_timed(service, spec) for _ in range(burst + extra)))
        claim_times = [t for t, pooled, _ in made if pooled]
        drained = [m for m in made if not m[1]]
        # The burst's Pods hold the node's CPU requests: gone before the cold creates.
        await asyncio.gather(*(service.delete(sid) for _, _, sid in made))
        colds = [await _timed(service, spec.model_copy(update={"workdir": "/cold"})) for _ in range(cold_n)]
    finally:
        await service.stop(delete_all=True)
    claim = LatencyStats.from_seconds(claim_times)
    cold = LatencyStats.from_seconds([t for t, _, _ in colds])
    drained_stats = LatencyStats.from_seconds([t for t, _, _ in drained])
    rows = [
        Row(metric=f"k8s claim p50, burst of {burst}", unit="ms", ours=claim.p50_ms, peers={K8S_COLD: cold.p50_ms},
            ratios={"cold/claim": ratio(cold.p50_ms, claim.p50_ms)}),
        Row(metric=f"k8s claim p99, burst of {burst}", unit="ms", ours=claim.p99_ms, peers={K8S_COLD: cold.p99_ms},
            targets=[Target(op="<=", limit=K8S_CLAIM_P99_MS)]),
        Row(metric=f"k8s burst of {burst}: claimed", unit="sandboxes", ours=len(claim_times),
            targets=[Target(op=">=", limit=burst)]),
        Row(metric=f"k8s create p50 of the {extra} that found the pool drained (cold fallback in the burst)",
            unit="ms", ours=drained_stats.p50_ms),
        Row(metric=f"k8s pool of {burst}: filled after", unit="s", ours=fill_s),
    ]
    return Findings(rows=rows, latencies={K8S_CLAIM: claim, K8S_COLD: cold, K8S_DRAINED: drained_stats},
                    notes=[f"Kubernetes: a pool of {burst} members (refill_parallel 16) on the dev cluster; once full, "
                           f"{burst + extra} creates at once: {burst} claimed (the agent's POST /claim at the Pod IP), "
                           f"the other {extra} find the pool drained (not refilled during the burst) and start cold "
                           f"beside them; then {cold_n} cold create→Ready one at a time for scale. No CPU or memory limits (BestEffort Pods), so "
                           "that no CFS quota slows the agents and 100 fit the dev cluster's one node."])


async def _timed(service, spec) -> tuple[float, bool, str]:
    started = time.perf_counter()
    info = await service.create(spec)
    return time.perf_counter() - started, bool(info.pool and info.pool.claimed), info.id


MEASUREMENT = Measurement(
    name="pools",
    title="Warm pools: claim vs cold create, sustained creates, memory; Kubernetes claim burst",
    method="See docs/pools.md. Embedded on the local backend: claims from a full pool vs cold creates in the "
           "same service; creates a second with the pool refilling; memory (PSS) per idle member. Kubernetes "
           "(when a cluster answers): a burst of claims from a full pool, then creates with the pool drained.",
    run=run,
)
