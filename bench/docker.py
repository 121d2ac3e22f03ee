"""Measurement: the docker backend on a real daemon (scripts/docker/daemon.sh's, or $DOCKER_HOST). Exec
round trip through Orchard straight to the agent in the container versus the Engine API's own exec
(`docker exec`, through the docker SDK) on the same container; create→ready one at a time versus
`docker run -d` of the same image until its process runs. Skipped (no rows, a note) when no daemon
answers."""

from __future__ import annotations

import asyncio
import secrets
import time

from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import time_agent_execs
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats

IMAGE = "localhost/orchard-debian:bookworm"
EXEC_P50_MS, DOCKER_EXEC_RATIO, CREATE_P50_MS, CREATE_VS_RUN = 5.0, 10.0, 1500.0, 2.0
ORCHARD_EXEC, DOCKER_EXEC = "Orchard exec (agent socket)", "docker exec (Engine API)"
ORCHARD_CREATE, DOCKER_RUN = "Orchard create→ready", "docker run -d → running"


def _skipped(reason: str) -> Findings:
    return Findings(rows=[], notes=[f"Skipped: {reason}. Start a daemon (`bash scripts/docker/daemon.sh up` and "
                                    "`... image`, as root) and run `python -m bench.run --only docker`."])


def run(ctx: BenchContext) -> Findings:
    from orchard.core.errors import OrchardError
    from orchard.sandbox.backends.registry import backend_config, create_backend
    from orchard.sandbox.server.home import resolve_home

    config = backend_config("docker", resolve_home(), instance=f"bench{secrets.token_hex(3)}")
    try:
        backend = create_backend(config)
    except OrchardError as e:
        return _skipped(str(e))
    try:
        return asyncio.run(_measure(ctx, backend, config.base_url))
    except OrchardError as e:
        return _skipped(str(e))


async def _measure(ctx: BenchContext, backend, base_url: str) -> Findings:
    import docker

    client = docker.DockerClient(base_url=base_url)
    try:
        execs, docker_execs = await _exec_round_trips(ctx, backend, client)
        ctx.console.print("create→ready, one at a time")
        creates = [await _timed_create(backend) for _ in range(ctx.pick(10, 3))]
        runs = [await asyncio.to_thread(_timed_docker_run, client) for _ in range(ctx.pick(10, 3))]
    finally:
        for found in await backend.list_live():
            await backend.delete(found)
        await backend.close()
        client.close()
    stats = {ORCHARD_EXEC: LatencyStats.from_seconds(execs), DOCKER_EXEC: LatencyStats.from_seconds(docker_execs),
             ORCHARD_CREATE: LatencyStats.from_seconds(creates), DOCKER_RUN: LatencyStats.from_seconds(runs)}
    ours, theirs = stats[ORCHARD_EXEC], stats[DOCKER_EXEC]
    made, started = stats[ORCHARD_CREATE], stats[DOCKER_RUN]
    rows = [
        Row(metric="exec round trip p50", unit="ms", ours=ours.p50_ms, peers={DOCKER_EXEC: theirs.p50_ms},
            ratios={"docker exec/orchard": ratio(theirs.p50_ms, ours.p50_ms)},
            targets=[Target(op="<=", limit=EXEC_P50_MS),
                     Target(on="docker exec/orchard", op=">=", limit=DOCKER_EXEC_RATIO)]),
        Row(metric="exec round trip p99", unit="ms", ours=ours.p99_ms, peers={DOCKER_EXEC: theirs.p99_ms},
            ratios={"docker exec/orchard": ratio(theirs.p99_ms, ours.p99_ms)}),
        Row(metric="create→ready p50 (one at a time)", unit="ms", ours=made.p50_ms,
            peers={DOCKER_RUN: started.p50_ms}, ratios={"orchard/docker run": ratio(made.p50_ms, started.p50_ms)},
            targets=[Target(op="<=", limit=CREATE_P50_MS),
                     Target(on="orchard/docker run", op="<=", limit=CREATE_VS_RUN)]),
    ]
    notes = ["Daemon of scripts/docker/daemon.sh (Debian's docker.io, runc) on the same 2 cores as the benchmark.",
             "Exec: `AgentSandbox.exec(['true'])` on a keep-alive connection to the agent's Unix socket (sandbox "
             "limited to 1 CPU) vs `container.exec_run(['true'])` of the docker SDK on the same container "
             "(exec create + start + inspect through the daemon).",
             "Create: Orchard's create returns once the injected agent answers /health (container, bundle mount, "
             "token file, agent start); `docker run -d` of the same image with `sleep infinity` is timed until "
             "the daemon reports it running, then removed."]
    return Findings(rows=rows, latencies=stats, notes=notes)


async def _exec_round_trips(ctx: BenchContext, backend, client) -> tuple[list[float], list[float]]:
    from orchard.core.sandbox import SandboxSpec
    from orchard.sandbox.agent_client import AgentSandbox

    sid, token = f"bench-exec-{secrets.token_hex(3)}", secrets.token_urlsafe(16)
    made = await backend.create(sid, SandboxSpec(image=IMAGE, cpu=1, memory_mb=256), token)
    async with AgentSandbox(sid, made.agent_url, token) as sandbox:
        execs = await time_agent_execs(sandbox, ctx.pick(300, 30))
    container = client.containers.get(made.handle["container_id"])
    docker_execs: list[float] = []
    for index in range(3 + ctx.pick(50, 5)):
        elapsed = await asyncio.to_thread(_timed_exec_run, container)
        if index >= 3:
            docker_execs.append(elapsed)
    await backend.delete(made)
    return execs, docker_execs


def _timed_exec_run(container) -> float:
    started = time.perf_counter()
    code, _ = container.exec_run(["true"])
    if code != 0:
        raise RuntimeError(f"docker exec `true` exited {code}")
    return time.perf_counter() - started


def _timed_docker_run(client) -> float:
    started = time.perf_counter()
    container = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                      labels={"orchard.dev/bench": "peer"})
    try:
        while container.status != "running":
            container.reload()
        return time.perf_counter() - started
    finally:
        container.remove(force=True)


async def _timed_create(backend) -> float:
    from orchard.core.sandbox import SandboxSpec

    sid = f"bench-{secrets.token_hex(4)}"
    started = time.perf_counter()
    made = await backend.create(sid, SandboxSpec(image=IMAGE, cpu=0.5, memory_mb=128), secrets.token_urlsafe(16))
    elapsed = time.perf_counter() - started
    await backend.delete(made)
    return elapsed


MEASUREMENT = Measurement(
    name="docker",
    title="Docker backend: exec vs docker exec, create→ready vs docker run",
    method="One container per sandbox on the daemon of scripts/docker/daemon.sh; the local image "
           f"`{IMAGE}` with the injected agent. Each sandbox is deleted before the next is made.",
    run=run,
)
