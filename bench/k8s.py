"""Measurement: the Kubernetes backend on a real cluster (the dev cluster of scripts/k8s/cluster.sh, or
$KUBECONFIG). Exec round trip through Orchard straight to the Pod IP versus `kubectl exec` on the same Pod
(1-CPU limit); create→Ready one at a time and for a burst of 50. Skipped (no rows, a note) when no
cluster answers."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import time_agent_execs
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats

NAMESPACE = "orchard-bench"
IMAGE = "localhost/orchard-base:local"
CLUSTER_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "k8s" / "cluster.sh"
EXEC_P50_MS, EXEC_P99_MS, KUBECTL_RATIO, CREATE_P50_MS = 5.0, 30.0, 40.0, 2500.0
ORCHARD_EXEC, KUBECTL_EXEC = "Orchard exec (Pod IP)", "kubectl exec"
CREATE_ONE, CREATE_BURST = "create→Ready, one at a time", "create→Ready, burst of 50"


def _kubeconfig() -> str | None:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    path = Path(os.environ.get("ORCHARD_K8S_DIR") or Path.home() / ".orchard" / "k8s") / "kubeconfig"
    return str(path) if path.is_file() else None


def _skipped(reason: str) -> Findings:
    return Findings(rows=[], notes=[f"Skipped: {reason}. Start the dev cluster (`make k8s-up`, as root) "
                                    "and run `python -m bench.run --only k8s`."])


def run(ctx: BenchContext) -> Findings:
    try:
        from orchard.sandbox.backends.kubernetes.client import probe_cluster
    except ImportError as e:
        return _skipped(f"the kubernetes client is not installed ({e})")
    kubeconfig = _kubeconfig()
    reason = "no kubeconfig" if kubeconfig is None else probe_cluster(kubeconfig)
    if reason:
        return _skipped(f"no Kubernetes cluster ({reason})")
    agent_image = os.environ.get("ORCHARD_K8S_AGENT_IMAGE")
    if not agent_image:
        from orchard.sandbox.backends.kubernetes.images import import_injector_image
        agent_image = import_injector_image(CLUSTER_SCRIPT)
    return asyncio.run(_measure(ctx, kubeconfig, agent_image))


async def _measure(ctx: BenchContext, kubeconfig: str, agent_image: str) -> Findings:
    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    backend = KubernetesBackend(namespace=NAMESPACE, instance=f"bench{secrets.token_hex(3)}",
                                agent_image=agent_image, image_pull_policy="Never", kubeconfig=kubeconfig)
    try:
        execs, kubectl = await _exec_round_trips(ctx, backend, kubeconfig)
        ctx.console.print("create→Ready, one at a time")
        single = [await _timed_create(backend, 0.1) for _ in range(ctx.pick(10, 3))]
        ctx.console.print("create→Ready, burst of 50")
        burst_size = ctx.pick(50, 10)
        started = time.perf_counter()
        burst = await asyncio.gather(*(_timed_create(backend, 0.02) for _ in range(burst_size)),
                                     return_exceptions=True)
        burst_wall = time.perf_counter() - started
    finally:
        for found in await backend.list_live():
            await backend.delete(found)
        await backend.close()
    ok = [b for b in burst if isinstance(b, float)]
    failures = [b for b in burst if not isinstance(b, float)]
    stats = {ORCHARD_EXEC: LatencyStats.from_seconds(execs), KUBECTL_EXEC: LatencyStats.from_seconds(kubectl),
             CREATE_ONE: LatencyStats.from_seconds(single)}
    if ok:
        stats[CREATE_BURST] = LatencyStats.from_seconds(ok)
    ours, theirs = stats[ORCHARD_EXEC], stats[KUBECTL_EXEC]
    rows = [
        Row(metric="exec round trip p50", unit="ms", ours=ours.p50_ms, peers={KUBECTL_EXEC: theirs.p50_ms},
            ratios={"kubectl/orchard": ratio(theirs.p50_ms, ours.p50_ms)},
            targets=[Target(op="<=", limit=EXEC_P50_MS), Target(on="kubectl/orchard", op=">=",
                                                                 limit=KUBECTL_RATIO)]),
        Row(metric="exec round trip p99", unit="ms", ours=ours.p99_ms, peers={KUBECTL_EXEC: theirs.p99_ms},
            ratios={"kubectl/orchard": ratio(theirs.p99_ms, ours.p99_ms)},
            targets=[Target(op="<=", limit=EXEC_P99_MS)]),
        Row(metric="create→Ready p50 (one at a time)", unit="ms", ours=stats[CREATE_ONE].p50_ms,
            targets=[Target(op="<=", limit=CREATE_P50_MS)]),
        Row(metric=f"burst of {burst_size}: Ready", unit="sandboxes", ours=len(ok),
            targets=[Target(op=">=", limit=burst_size)]),
        Row(metric=f"burst of {burst_size}: all Ready after", unit="s", ours=burst_wall),
    ]
    if ok:
        rows.append(Row(metric=f"burst of {burst_size}: create→Ready p50", unit="ms",
                        ours=stats[CREATE_BURST].p50_ms))
    notes = ["Single-node dev cluster (scripts/k8s/cluster.sh) on the same 2 cores as the benchmark: the "
             "control plane, kubelet and containerd compete with the pods it starts.",
             "Exec: `AgentSandbox.exec(['true'])` on a keep-alive connection to the agent at the Pod IP "
             "(sandbox limited to 1 CPU) vs `kubectl exec POD -c sandbox -- true` on the same Pod "
             "(process start + API server + kubelet streaming)."]
    if failures:
        notes.append(f"{len(failures)} burst creates failed: {failures[0]}")
    return Findings(rows=rows, latencies=stats, notes=notes)


async def _exec_round_trips(ctx: BenchContext, backend, kubeconfig: str) -> tuple[list[float], list[float]]:
    from orchard.core.sandbox import SandboxSpec
    from orchard.sandbox.agent_client import AgentSandbox
    sid, token = f"bench-exec-{secrets.token_hex(3)}", secrets.token_urlsafe(16)
    made = await backend.create(sid, SandboxSpec(image=IMAGE, cpu=1, memory_mb=256), token)
    async with AgentSandbox(sid, made.agent_url, token) as sandbox:
        execs = await time_agent_execs(sandbox, ctx.pick(200, 30))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl is not installed; it is the peer of this measurement")
    argv = [kubectl, "--kubeconfig", kubeconfig, "-n", NAMESPACE, "exec", made.handle["pod"], "-c", "sandbox",
            "--", "true"]
    kubectl_times: list[float] = []
    for index in range(2 + ctx.pick(50, 5)):
        started = await asyncio.to_thread(_run_timed, argv)
        if index >= 2:
            kubectl_times.append(started)
    await backend.delete(made)
    return execs, kubectl_times


def _run_timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


async def _timed_create(backend, cpu: float) -> float:
    from orchard.core.sandbox import SandboxSpec
    sid = f"bench-{secrets.token_hex(4)}"
    started = time.perf_counter()
    made = await backend.create(sid, SandboxSpec(image=IMAGE, cpu=cpu, memory_mb=48), "t")
    elapsed = time.perf_counter() - started
    if not made.agent_url:
        raise RuntimeError(f"sandbox {sid} has no agent URL")
    return elapsed


MEASUREMENT = Measurement(
    name="k8s",
    title="Kubernetes backend: exec vs kubectl exec, create→Ready",
    method="One Pod per sandbox on the local single-node cluster; `localhost/orchard-base:local` (busybox, "
           "no Python) with the injected agent. Sandboxes of the burst stay up until the burst ends.",
    run=run,
)
