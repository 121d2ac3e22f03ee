"""Sandbox egress on Kubernetes holds without a policy-capable CNI: the dev cluster's `bridge` CNI
enforces no NetworkPolicy, so everything here is the egress guard's doing (nftables rules that an init
container installs in the Pod's network namespace; orchard/sandbox/backends/kubernetes/egress.py).

Only addresses of this cluster are contacted: Pod IPs, the node IP, the `kubernetes` Service IP and
loopback. Each probe runs inside a sandbox with the agent's bundled Python and reports `connected` or the
errno of the failed connect/send. The guard refuses at once, from the Pod's own kernel: a TCP connect
gets EHOSTUNREACH (its ICMP "administratively prohibited"), a UDP send EPERM; the `open` control test
shows each target does answer."""

from __future__ import annotations

import json
import secrets

import pytest
import pytest_asyncio

from orchard.core.errors import BackendError
from orchard.core.sandbox import NetworkPolicy, SandboxSpec

pytestmark = [pytest.mark.k8s, pytest.mark.asyncio(loop_scope="module")]

BASE_IMAGE = "localhost/orchard-base:local"
ALLOWED_PORT, OTHER_PORT = 8080, 8081
AGENT_PORT = 7777
DENIED = "EHOSTUNREACH"
# Connect (TCP) or send (UDP) once; print "connected"/"sent" or the errno's name.
PROBE = """
import errno, socket, sys
host, port, proto, wait = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
s.settimeout(wait)
try:
    if proto == "tcp":
        s.connect((host, port))
        print("connected")
    else:
        s.sendto(b"x", (host, port))
        print("sent")
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"""
# Capabilities in effect and whether a packet socket (which would bypass netfilter) can be opened.
SELF_CHECK = """
import socket
caps = int([l for l in open("/proc/self/status") if l.startswith("CapEff:")][0].split()[1], 16)
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    packet = "opened"
except PermissionError:
    packet = "denied"
print(json.dumps({"net_admin": bool(caps >> 12 & 1), "net_raw": bool(caps >> 13 & 1), "packet": packet}))
"""


# `kubeconfig` and `agent_image` are conftest.py's.


@pytest.fixture(scope="module")
def core(kubeconfig):
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    api_client = load_api_client(kubeconfig)
    yield client.CoreV1Api(api_client)
    api_client.close()


@pytest.fixture(scope="module")
def namespace(core):
    name = f"orchard-egress-{secrets.token_hex(3)}"
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(kubeconfig, agent_image, namespace):
    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    made = KubernetesBackend(namespace=namespace, instance="egress", agent_image=agent_image,
                             image_pull_policy="Never", kubeconfig=kubeconfig)
    yield made
    for found in await made.list_live():
        await made.delete(found)
    await made.close()


class Box:
    """A sandbox and its agent, with probes that run inside it."""

    def __init__(self, made, sandbox, bundle):
        self.made, self.sb, self.bundle = made, sandbox, bundle
        self.ip = made.handle["ip"]

    def _python(self, script: str, *args: str) -> list[str]:
        m, mount = self.bundle.manifest, "/.orchard"
        return [f"{mount}/{m.loader}", "--library-path", f"{mount}/{m.library_dir}", f"{mount}/{m.python}",
                "-s", "-S", "-B", "-c", script, *args]

    async def probe(self, host: str, port: int, proto: str = "tcp", wait: float = 10) -> str:
        result = await self.sb.exec(self._python(PROBE, host, str(port), proto, str(wait)), timeout=60)
        assert result.exit_code == 0, result
        return result.stdout.strip()

    async def self_check(self) -> dict:
        result = await self.sb.exec(self._python("import json\n" + SELF_CHECK), timeout=60)
        assert result.exit_code == 0, result
        return json.loads(result.stdout)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def boxes(backend):
    """`open` (two listeners), `none`, and `allowlist` (only the first listener)."""
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.bundle import ensure_agent_bundle
    bundle = ensure_agent_bundle()  # the one the backend launches the agent from

    async def make(name: str, network: NetworkPolicy) -> Box:
        sid, token = f"{name}-{secrets.token_hex(4)}", secrets.token_urlsafe(16)
        made = await backend.create(sid, SandboxSpec(image=BASE_IMAGE, network=network), token)
        return Box(made, AgentSandbox(sid, made.agent_url, token), bundle)

    opened = await make("open", NetworkPolicy(mode="open"))
    started = await opened.sb.exec(f"mkdir -p /tmp/www && echo hi >/tmp/www/index.html && "
                                   f"httpd -p {ALLOWED_PORT} -h /tmp/www && httpd -p {OTHER_PORT} -h /tmp/www")
    assert started.exit_code == 0, started
    closed = await make("none", NetworkPolicy(mode="none"))
    allowed = await make("allow", NetworkPolicy(mode="allowlist", allow=[f"{opened.ip}:{ALLOWED_PORT}"]))
    made = {"open": opened, "none": closed, "allowlist": allowed}
    yield made
    for box in made.values():
        await box.sb.close()


@pytest.fixture(scope="module")
def cluster_addresses(core, boxes) -> dict[str, tuple[str, int]]:
    """The node (kubelet, API server on the node IP) and the API server's Service IP."""
    host_ip = core.read_namespaced_pod(boxes["none"].made.handle["pod"], boxes["none"].made.handle["namespace"]
                                       ).status.host_ip
    endpoints = core.read_namespaced_endpoints("kubernetes", "default").subsets[0]
    service_ip = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
    return {"kubelet": (host_ip, 10250),
            "apiserver": (endpoints.addresses[0].ip, endpoints.ports[0].port),
            "apiserver-service": (service_ip, 443)}


async def test_open_sandbox_reaches_pods_node_and_api_server(boxes, cluster_addresses):
    """The control: from an `open` Pod every target below is reachable, so a denial elsewhere is the
    guard's, not an absent peer."""
    opened = boxes["open"]
    assert await opened.probe(opened.ip, ALLOWED_PORT) == "connected"
    assert await opened.probe(boxes["none"].ip, AGENT_PORT) == "connected"
    for name, (host, port) in cluster_addresses.items():
        assert await opened.probe(host, port) == "connected", name


async def test_none_reaches_nothing_but_itself(boxes, cluster_addresses):
    closed, listener = boxes["none"], boxes["open"]
    assert await closed.probe(listener.ip, ALLOWED_PORT) == DENIED
    assert await closed.probe(listener.ip, AGENT_PORT) == DENIED
    assert await closed.probe(listener.ip, ALLOWED_PORT, "udp") == "EPERM"
    for name, (host, port) in cluster_addresses.items():
        assert await closed.probe(host, port) == DENIED, name
    # Loopback and its own Pod IP are the sandbox itself: its agent answers there.
    assert await closed.probe("127.0.0.1", AGENT_PORT) == "connected"
    assert await closed.probe(closed.ip, AGENT_PORT) == "connected"


async def test_guarded_agent_stays_reachable(boxes):
    """Replies to connections made to the agent pass: exec from here, and a connect from another Pod."""
    closed = boxes["none"]
    result = await closed.sb.exec(["echo", "still here"])
    assert (result.exit_code, result.stdout) == (0, "still here\n")
    assert await boxes["open"].probe(closed.ip, AGENT_PORT) == "connected"


async def test_other_listeners_in_a_guarded_pod_cannot_answer(boxes):
    """Ingress is open, but only the agent's port may reply: a server the workload starts gets the SYN
    and its SYN-ACK is refused in its own Pod, so the caller never connects (it waits in vain)."""
    closed = boxes["none"]
    started = await closed.sb.exec(f"mkdir -p /tmp/www && httpd -p {OTHER_PORT} -h /tmp/www")
    assert started.exit_code == 0, started
    assert await closed.probe("127.0.0.1", OTHER_PORT) == "connected"  # it does listen
    assert await boxes["open"].probe(closed.ip, OTHER_PORT, wait=3) == "timeout"


async def test_allowlist_reaches_only_the_listed_target(boxes, cluster_addresses):
    allowed, listener = boxes["allowlist"], boxes["open"]
    assert await allowed.probe(listener.ip, ALLOWED_PORT) == "connected"
    assert await allowed.probe(listener.ip, OTHER_PORT) == DENIED
    assert await allowed.probe(listener.ip, AGENT_PORT) == DENIED
    for name, (host, port) in cluster_addresses.items():
        assert await allowed.probe(host, port) == DENIED, name
    assert (await allowed.sb.exec(["true"])).exit_code == 0


async def test_workload_can_neither_change_nor_bypass_the_rules(boxes):
    """No NET_ADMIN (the rules cannot be removed) and no NET_RAW (a packet socket skips netfilter)."""
    for mode in ("none", "allowlist"):
        assert await boxes[mode].self_check() == {"net_admin": False, "net_raw": False, "packet": "denied"}


async def test_guard_only_where_needed_with_the_table_in_its_log(core, boxes):
    """`none`/`allowlist` Pods start with the guard, which logs the table it installed; `open` has none."""
    def init_names(box):
        pod = core.read_namespaced_pod(box.made.handle["pod"], box.made.handle["namespace"])
        return [c.name for c in pod.spec.init_containers], pod
    names, pod = init_names(boxes["allowlist"])
    assert names == ["egress-guard", "agent-injector"]
    guard = pod.spec.init_containers[0].security_context
    assert (guard.capabilities.drop, guard.capabilities.add) == (["ALL"], ["NET_ADMIN"])
    log = core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, container="egress-guard")
    assert "policy drop;" in log and f"ip daddr {boxes['open'].ip} tcp dport {ALLOWED_PORT} accept" in log
    assert init_names(boxes["none"])[0] == ["egress-guard", "agent-injector"]
    assert init_names(boxes["open"])[0] == ["agent-injector"]


async def test_guard_failure_fails_the_create_and_leaves_nothing(kubeconfig, namespace, core):
    """An injector image without the egress tool (built before it existed): the create names the egress
    guard and removes everything it made."""
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    backend = KubernetesBackend(namespace=namespace, instance="egress-broken", agent_image=BASE_IMAGE,
                                image_pull_policy="Never", kubeconfig=kubeconfig)
    sid = f"broken-{secrets.token_hex(4)}"
    try:
        with pytest.raises(BackendError, match="egress guard"):
            await backend.create(sid, SandboxSpec(image=BASE_IMAGE), "t")
    finally:
        await backend.close()
    selector = f"orchard.dev/sandbox={sid}"
    pods = [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.metadata.deletion_timestamp is None]
    net = client.NetworkingV1Api(core.api_client)
    assert (pods, core.list_namespaced_secret(namespace, label_selector=selector).items,
            net.list_namespaced_network_policy(namespace, label_selector=selector).items) == ([], [], [])
