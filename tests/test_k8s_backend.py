"""The Kubernetes backend against a real cluster (scripts/k8s/cluster.sh in CI). Each test uses its own
`instance` label in one session namespace, so reconcile in one test never sees another's sandboxes.
Sandboxes run `localhost/orchard-base:local`: busybox, no Python — the agent is injected."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import httpx
import pytest

from orchard.core.errors import InvalidRequest, SandboxLost
from orchard.core.sandbox import NetworkPolicy, SandboxSpec
from tests.hang_guard import returns
from tests.k8s_cluster import POD_PIDS_LIMIT, delete_namespace
from tests.running_server import free_port

pytestmark = pytest.mark.k8s

BASE_IMAGE = "localhost/orchard-base:local"


# `kubeconfig` and `agent_image` are conftest.py's.


@pytest.fixture(scope="session")
def namespace(kubeconfig):
    name = f"orchard-test-{secrets.token_hex(3)}"
    yield name
    delete_namespace(kubeconfig, name)


@pytest.fixture
def api(kubeconfig):
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    api_client = load_api_client(kubeconfig)
    yield client.CoreV1Api(api_client), client.NetworkingV1Api(api_client), api_client
    api_client.close()


@pytest.fixture
def instance() -> str:
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
async def backend(kubeconfig, agent_image, namespace, instance):
    made = _backend(kubeconfig, agent_image, namespace, instance)
    yield made
    for found in await made.list_live():
        await made.delete(found)
    await made.close()


def _backend(kubeconfig, agent_image, namespace, instance):
    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    return KubernetesBackend(namespace=namespace, instance=instance, agent_image=agent_image,
                             image_pull_policy="Never", kubeconfig=kubeconfig, pod_pids_limit=POD_PIDS_LIMIT)


def _sandbox_id() -> str:
    return f"sb-{secrets.token_hex(6)}"


def _objects_of(api, namespace: str, sandbox_id: str) -> list[str]:
    """Every Pod (not being deleted), Secret and NetworkPolicy labelled with this sandbox."""
    core, net, _ = api
    selector = f"orchard.dev/sandbox={sandbox_id}"
    pods = [f"pod/{p.metadata.name}" for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]
    secrets_ = [f"secret/{s.metadata.name}"
                for s in core.list_namespaced_secret(namespace, label_selector=selector).items]
    policies = [f"networkpolicy/{p.metadata.name}"
                for p in net.list_namespaced_network_policy(namespace, label_selector=selector).items]
    return pods + secrets_ + policies


async def test_agent_injected_into_image_without_python(backend):
    """busybox has no Python: the agent runs from the injected bundle; exec, files and shell work."""
    from orchard.sandbox.agent_client import AgentSandbox
    sid, token = _sandbox_id(), secrets.token_urlsafe(16)
    made = await backend.create(sid, SandboxSpec(image=BASE_IMAGE, cpu=0.5, memory_mb=128), token)
    assert made.agent_url.startswith("http://10.") and made.agent_url.endswith(":7777")
    # Pod created → running with an IP, then → the agent's first health answer
    timings = made.timings
    assert timings.backend_create_ms > 0 and timings.first_health_ms >= 0 and timings.agent_start_ms is None
    assert timings.backend_create_ms + timings.first_health_ms <= timings.total_ms
    async with AgentSandbox(sid, made.agent_url, token) as sb:
        which = await sb.exec("command -v python3 python; ls /usr/bin | grep -c python || true")
        assert which.stdout.strip() == "0", which
        assert (await sb.exec(["busybox", "echo", "hello"])).stdout == "hello\n"
        await sb.write_file("notes/a.txt", "data\n")
        assert await sb.read_file("/workspace/notes/a.txt") == b"data\n"
        assert [f.name for f in await sb.list_dir("notes")] == ["a.txt"]
        shell = await sb.shell()
        await shell.run("cd /tmp && export X=42")
        assert (await shell.run("echo $PWD $X")).output.strip() == "/tmp 42"
    wrong = AgentSandbox(sid, made.agent_url, "not-the-token")
    with pytest.raises(Exception, match="token|unauthorized|Unauthorized"):
        await wrong.exec("true")
    await wrong.close()
    assert await backend.is_alive(made)


async def test_token_never_in_the_pod_spec(backend, api, namespace):
    core, _, api_client = api
    sid, token = _sandbox_id(), secrets.token_urlsafe(24)
    await backend.create(sid, SandboxSpec(image=BASE_IMAGE), token, owner="alice")
    pod = core.read_namespaced_pod(f"orchard-{sid}", namespace)
    text = json.dumps(api_client.sanitize_for_serialization(pod))
    assert token not in text
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes["orchard-token"].secret.secret_name == f"orchard-{sid}-token"
    secret = core.read_namespaced_secret(f"orchard-{sid}-token", namespace)
    assert [r.uid for r in secret.metadata.owner_references] == [pod.metadata.uid]
    assert pod.metadata.annotations["orchard.dev/owner"] == "alice"
    assert float(pod.metadata.annotations["orchard.dev/deadline"]) == pytest.approx(time.time() + 3600, abs=60)
    assert pod.spec.termination_grace_period_seconds == 1
    assert pod.spec.containers[0].readiness_probe.http_get.path == "/health"


async def test_network_policies_exactly_as_intended(backend, api, namespace, instance):
    _, net, api_client = api
    allow = await backend.create("np-allow-" + secrets.token_hex(3), SandboxSpec(
        image=BASE_IMAGE, network=NetworkPolicy(mode="allowlist", allow=["10.1.2.0/24", "192.0.2.7:443"])), "t")
    opened = await backend.create("np-open-" + secrets.token_hex(3),
                                  SandboxSpec(image=BASE_IMAGE, network=NetworkPolicy(mode="open")), "t")
    closed = await backend.create("np-none-" + secrets.token_hex(3), SandboxSpec(image=BASE_IMAGE), "t")

    def spec_of(name: str) -> dict:
        return api_client.sanitize_for_serialization(net.read_namespaced_network_policy(name, namespace).spec)

    assert spec_of("orchard-deny-all-egress") == {"podSelector": {}, "policyTypes": ["Egress"]}
    ports_443 = [{"port": 443, "protocol": "TCP"}, {"port": 443, "protocol": "UDP"}]
    assert spec_of(f"orchard-{allow.id}-egress") == {
        "podSelector": {"matchLabels": {"orchard.dev/sandbox": allow.id}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.1.2.0/24"}}]},
                   {"to": [{"ipBlock": {"cidr": "192.0.2.7/32"}}], "ports": ports_443}]}
    assert spec_of(f"orchard-{opened.id}-egress") == {
        "podSelector": {"matchLabels": {"orchard.dev/sandbox": opened.id}}, "policyTypes": ["Egress"],
        "egress": [{}]}
    names = {p.metadata.name for p in net.list_namespaced_network_policy(
        namespace, label_selector=f"orchard.dev/instance={instance}").items}
    assert f"orchard-{closed.id}-egress" not in names  # "none": only the namespace-wide deny applies
    sid = _sandbox_id()
    with pytest.raises(InvalidRequest, match="host name"):
        await backend.create(sid, SandboxSpec(image=BASE_IMAGE, network=NetworkPolicy(
            mode="allowlist", allow=["pypi.org:443"])), "t")
    assert _objects_of(api, namespace, sid) == []


async def test_bad_specs_fail_fast_and_leave_nothing(backend, api, namespace):
    sid = _sandbox_id()
    # fast: the pod's own failure, not the create's wait for readiness, ends the create
    with pytest.raises(InvalidRequest, match="ErrImageNeverPull.*check the image name"):
        await returns(backend.create(sid, SandboxSpec(image="localhost/no-such-image:nope"), "t"),
                      "a create of a missing image")
    assert _objects_of(api, namespace, sid) == []

    for too_much in (SandboxSpec(image=BASE_IMAGE, cpu=512), SandboxSpec(image=BASE_IMAGE, memory_mb=2**24)):
        sid = _sandbox_id()
        with pytest.raises(InvalidRequest, match="no node can hold this sandbox"):
            await returns(backend.create(sid, too_much, "t"), "a create no node can hold")
        assert _objects_of(api, namespace, sid) == []
    with pytest.raises(InvalidRequest, match="OCI image"):
        await backend.create(_sandbox_id(), SandboxSpec(), "t")


async def test_pod_killed_mid_exec_is_sandbox_lost(backend, api, namespace):
    from orchard.sandbox.agent_client import AgentSandbox
    core, _, _ = api
    sid, token = _sandbox_id(), "tok"
    made = await backend.create(sid, SandboxSpec(image=BASE_IMAGE), token)
    async with AgentSandbox(sid, made.agent_url, token) as sb:
        running = asyncio.create_task(sb.exec("sleep 60"))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(core.delete_namespaced_pod, f"orchard-{sid}", namespace, grace_period_seconds=0)
        with pytest.raises(SandboxLost, match="probably deleted, expired or crashed"):
            await asyncio.wait_for(running, 30)
        with pytest.raises(SandboxLost, match=f"sandbox {sid}"):
            await sb.exec("true")
    assert not await backend.is_alive(made)


async def test_orchestrator_restart_reconciles(kubeconfig, agent_image, namespace, instance, tmp_path):
    """A stopped service's sandboxes are re-adopted by the next one on the same store; a Pod nobody
    knows is deleted."""
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.server.service import SandboxService
    from orchard.sandbox.server.store import SandboxStore
    db = tmp_path / "state.db"
    first = SandboxService(_backend(kubeconfig, agent_image, namespace, instance), SandboxStore(db))
    await first.start()
    kept = [await first.create({"image": BASE_IMAGE}, owner="bob") for _ in range(2)]
    await first.stop()
    stray = _backend(kubeconfig, agent_image, namespace, instance)
    orphan = await stray.create(_sandbox_id(), SandboxSpec(image=BASE_IMAGE), "t")
    await stray.close()

    second = SandboxService(_backend(kubeconfig, agent_image, namespace, instance), SandboxStore(db))
    report = await second.start()
    try:
        assert sorted(report.adopted) == sorted(i.id for i in kept)
        assert report.orphans_removed == [orphan.id]
        assert orphan.id not in {b.id for b in await second.backend.list_live()}
        async with AgentSandbox(kept[0].id, kept[0].agent_url, kept[0].token) as sb:
            assert (await sb.exec("echo still here")).stdout == "still here\n"
    finally:
        await second.stop(delete_all=True)


@pytest.mark.slow
async def test_lifecycle_through_the_sdk_and_orchard_serve(kubeconfig, agent_image, namespace, instance,
                                                           tmp_path, api):
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.client import AsyncOrchard
    port, key = free_port(), secrets.token_urlsafe(16)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "ORCHARD_K8S_NAMESPACE": namespace,
           "ORCHARD_K8S_INSTANCE": instance, "ORCHARD_K8S_AGENT_IMAGE": agent_image,
           "ORCHARD_K8S_IMAGE_PULL_POLICY": "Never", "ORCHARD_HOME": str(tmp_path), "ORCHARD_API_KEY": key,
           "ORCHARD_K8S_POD_PIDS_LIMIT": str(POD_PIDS_LIMIT)}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "orchard.cli.main", "serve", "--backend", "kubernetes",
                                   "--port", str(port)], env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            assert server.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                await asyncio.sleep(0.1)
        async with AsyncOrchard(url, key) as orch:
            sb = await orch.create(image=BASE_IMAGE, cpu=1, memory_mb=128, labels={"suite": "k8s"})
            info = await orch.get(sb.id)
            assert info.backend == "kubernetes" and info.state == "ready"
            assert (await sb.exec("echo $((6*7))")).stdout == "42\n"
            await sb.write_file("x.txt", b"\x00\x01binary")
            assert await sb.read_file("x.txt") == b"\x00\x01binary"
            assert [i.id for i in await orch.list(labels={"suite": "k8s"})] == [sb.id]
            direct = AgentSandbox(sb.id, info.agent_url, info.token)
            await orch.delete(sb.id)
            assert _objects_of(api, namespace, sb.id) == []
            with pytest.raises(SandboxLost):
                await direct.exec("true")
            await direct.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


@pytest.mark.slow
async def test_burst_of_50_all_ready(backend):
    from orchard.sandbox.agent_client import AgentSandbox
    ids = [_sandbox_id() for _ in range(50)]
    started = time.monotonic()
    made = await asyncio.gather(*(backend.create(i, SandboxSpec(image=BASE_IMAGE, cpu=0.02, memory_mb=48), "t")
                                  for i in ids))
    elapsed = time.monotonic() - started
    print(f"50 sandboxes Ready in {elapsed:.1f} s")
    assert sorted(m.id for m in made) == sorted(ids)
    assert len({m.agent_url for m in made}) == 50

    async def echo(m):
        async with AgentSandbox(m.id, m.agent_url, "t") as sb:
            return (await sb.exec(["echo", m.id])).stdout.strip()

    assert await asyncio.gather(*(echo(m) for m in made)) == [m.id for m in made]
    await asyncio.gather(*(backend.delete(m) for m in made))
    assert await backend.list_live() == []
