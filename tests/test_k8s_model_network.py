"""Model-only networking on Kubernetes: the backend's `model_gateway` (http://IP:PORT) becomes an egress
rule to that address alone in the sandbox's NetworkPolicy and in its Pod's egress guard, and the agent's
forwarder relays 127.0.0.1:4000 inside the Pod to it. The manifests are checked without a cluster; the
rest runs on the dev cluster (`k8s` marker), whose bridge CNI enforces no NetworkPolicy, so what holds
there is the egress guard's doing. The gateway is the evaluation's own (LocalGateway) bound to the node's
IP, with the scripted model server behind it."""

from __future__ import annotations

import json
import secrets
import socket

import pytest
import pytest_asyncio
from pydantic import ValidationError

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import MODEL_GATEWAY_URL, NetworkPolicy, SandboxSpec
from orchard.sandbox.backends.kubernetes.config import KubernetesConfig
from orchard.sandbox.backends.kubernetes.egress import egress_ruleset
from orchard.sandbox.backends.kubernetes.gateway import parse_model_gateway
from orchard.sandbox.backends.kubernetes.netpol import sandbox_policy_manifest
from tests.k8s_cluster import delete_namespace

BASE_IMAGE = "localhost/orchard-base:local"
NODE_IP = "10.239.255.1"  # the dev cluster's node address (on the host's lo), which Pods reach
MODEL = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
# A harness's chat call inside the Pod (the agent's bundled Python: the image has none); prints status, body.
CALL = r"""
import http.client, sys
path, key, body = sys.argv[1], sys.argv[2], sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", 4000, timeout=30)
conn.request("POST" if body else "GET", path, body.encode() or None,
             {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
response = conn.getresponse()
print(response.status); print(response.read().decode())
"""
PROBE = r"""
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close(); print("connected")
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"""


# ---- manifests (no cluster) --------------------------------------------------------------------------

def test_the_gateway_is_an_address_and_port_and_nothing_else():
    gateway = parse_model_gateway(f"http://{NODE_IP}:4100")
    assert gateway.agent_target == f"tcp:{NODE_IP}:4100"
    assert parse_model_gateway("http://[fd00::7]:80").agent_target == "tcp:[fd00::7]:80"
    for bad in ("http://gateway.orchard.svc:4000", f"unix:/run/gw.sock", f"http://{NODE_IP}",
                f"https://{NODE_IP}:443", f"http://{NODE_IP}:4000/v1"):
        with pytest.raises(ValidationError, match="does not fit the kubernetes backend"):
            KubernetesConfig(model_gateway=bad)


def test_policy_and_guard_allow_the_gateway_only_when_asked():
    gateway = parse_model_gateway(f"http://{NODE_IP}:4100")
    model = NetworkPolicy(mode="model")
    assert sandbox_policy_manifest("s", "i", model, gateway)["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}], "ports": [{"protocol": "TCP", "port": 4100}]}]
    assert sandbox_policy_manifest("s", "i", NetworkPolicy(), gateway) is None  # none: the namespace's deny
    allow = sandbox_policy_manifest("s", "i", NetworkPolicy(mode="allowlist", allow=["192.0.2.7"], gateway=True),
                                    gateway)["spec"]["egress"]
    assert [rule["to"][0]["ipBlock"]["cidr"] for rule in allow] == ["192.0.2.7/32", f"{NODE_IP}/32"]
    assert f"ip daddr {NODE_IP} tcp dport 4100 accept" in egress_ruleset(model, gateway=gateway)
    assert f"{NODE_IP}" not in egress_ruleset(NetworkPolicy(), gateway=gateway)


# ---- on the dev cluster --------------------------------------------------------------------------------

# `kubeconfig` and `agent_image` are conftest.py's.


@pytest.fixture(scope="module")
def namespace(kubeconfig):
    name = f"orchard-gw-{secrets.token_hex(3)}"
    yield name
    delete_namespace(kubeconfig, name, missing_ok=True)


@pytest.fixture(scope="module")
def gateway(kubeconfig):
    from orchard.eval.local_gateway import LocalGateway
    from orchard.gateway.config import GatewayConfig, ModelRoute
    from orchard.testing.scripted_model import create_scripted_app
    from orchard.testing.scripted_script import Script
    from orchard.util.uvicorn_thread import ServerThread

    script = Script.parse({"responses": [{"content": "hello from the gateway"}], "loop": True}, where="test")
    with ServerThread(create_scripted_app(script), what="the scripted model server") as model:
        config = GatewayConfig(models={"policy": ModelRoute(model="openai/scripted", api_base=f"{model.url}/v1",
                                                            api_key="unused")})
        with LocalGateway(config, host=NODE_IP, unix_socket=False) as gw:
            yield gw


def _backend(kubeconfig, agent_image, namespace, model_gateway):
    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    return KubernetesBackend(namespace=namespace, instance=f"t{secrets.token_hex(4)}", agent_image=agent_image,
                             image_pull_policy="Never", kubeconfig=kubeconfig, model_gateway=model_gateway)


@pytest_asyncio.fixture
async def sandbox(kubeconfig, agent_image, namespace, gateway):
    from orchard.sandbox.agent_client import AgentSandbox
    backend = _backend(kubeconfig, agent_image, namespace, gateway.url)
    token = secrets.token_hex(16)
    made = await backend.create(f"gw-{secrets.token_hex(5)}", SandboxSpec(
        image=BASE_IMAGE, network=NetworkPolicy(mode="model")), token)
    agent = AgentSandbox(made.id, made.agent_url, token)
    try:
        yield agent, backend
    finally:
        await agent.close()
        for found in await backend.list_live():
            await backend.delete(found)
        await backend.close()


async def _python(agent, backend, script: str, *args: str) -> str:
    m, mount = backend._bundle.manifest, "/.orchard"
    result = await agent.exec([f"{mount}/{m.loader}", "--library-path", f"{mount}/{m.library_dir}",
                               f"{mount}/{m.python}", "-s", "-S", "-B", "-c", script, *args], timeout=60)
    assert result.exit_code == 0, result
    return result.stdout


@pytest.mark.k8s
async def test_inside_a_pod_the_gateway_answers_for_its_rollout_and_nothing_else_is_reachable(sandbox, gateway):
    agent, backend = sandbox
    key, other = f"k8s-{secrets.token_hex(4)}", f"other-{secrets.token_hex(4)}"
    path = f"/r/{key}/v1/chat/completions"
    assert gateway.rollout_base_url(key) == f"{MODEL_GATEWAY_URL}/r/{key}/v1"
    status, _, body = (await _python(agent, backend, CALL, path, gateway.rollout_api_key(key),
                                     json.dumps(MODEL))).partition("\n")
    assert status == "200", body
    assert json.loads(body)["choices"][0]["message"]["content"] == "hello from the gateway"
    assert [call.rollout_key for call in gateway.end_rollout(key)] == [key]
    status, _, body = (await _python(agent, backend, CALL, f"/r/{other}/v1/chat/completions",
                                     gateway.rollout_api_key(key), json.dumps(MODEL))).partition("\n")
    assert status == "401" and gateway.end_rollout(other) == []

    with socket.socket() as elsewhere:  # another service on the node's address: not the gateway's port
        elsewhere.bind((NODE_IP, 0))
        elsewhere.listen()
        for host, port in ((NODE_IP, elsewhere.getsockname()[1]), ("1.1.1.1", 80), ("10.96.0.1", 443)):
            assert (await _python(agent, backend, PROBE, host, str(port))).strip() == "EHOSTUNREACH", (host, port)
    # the gateway's own address is reachable only on its port, and only through the guard's one rule
    assert (await _python(agent, backend, PROBE, NODE_IP, str(gateway.port))).strip() == "connected"


@pytest.mark.k8s
async def test_a_gateway_without_a_configured_one_is_refused_and_leaves_nothing(kubeconfig, agent_image, namespace):
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    backend = _backend(kubeconfig, agent_image, namespace, None)
    sid = f"gw-{secrets.token_hex(5)}"
    try:
        assert any("model gateway" in p for p in backend.capabilities.lacks(SandboxSpec(
            image=BASE_IMAGE, network=NetworkPolicy(mode="model"))))
        with pytest.raises(InvalidRequest, match="model network without a gateway"):
            await backend.create(sid, SandboxSpec(image=BASE_IMAGE, network=NetworkPolicy(mode="model")), "t")
    finally:
        await backend.close()
    api = load_api_client(kubeconfig)
    try:
        selector = f"orchard.dev/sandbox={sid}"
        assert not client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
        assert not client.NetworkingV1Api(api).list_namespaced_network_policy(namespace,
                                                                               label_selector=selector).items
    finally:
        api.close()
