"""Model-only networking on the local backend, on real parts: the scripted model server behind the
evaluation's own gateway (LocalGateway, TCP and its Unix socket), real bubblewrap sandboxes with
`network.mode = "model"`, and a harness's view from inside (the bundled agent's forwarder at
127.0.0.1:4000). From inside, the gateway answers for the sandbox's own rollout and nothing else is
reachable; asking for a gateway where none is configured is refused by name, leaving nothing behind."""

from __future__ import annotations

import json
import secrets
import socket
import sys

import pytest
from pydantic import ValidationError

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import MODEL_GATEWAY_URL, NetworkPolicy, SandboxSpec
from orchard.eval.local_gateway import LocalGateway
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.local.config import LocalConfig
from orchard.testing.scripted_model import create_scripted_app
from orchard.testing.scripted_script import Script
from orchard.util.uvicorn_thread import ServerThread
from tests.local_backend_rig import local_backend, running
from tests.test_local_allowlist import remote  # noqa: F401  (a fixture: another machine, behind a veth pair)

MODEL = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
# What a harness inside runs: one OpenAI-style call with the standard library, printing status and body.
CALL = r"""
import json, sys, urllib.error, urllib.request
url, key, body = sys.argv[1], sys.argv[2], sys.argv[3]
request = urllib.request.Request(url, data=body.encode() if body else None,
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=30) as response:
        print(response.status); print(response.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"""
# Whether a TCP connection to host:port gets through (prints "connected" or the error's name).
CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close(); print("connected")
except OSError as e:
    print(type(e).__name__)
"""


@pytest.fixture(scope="module")
def gateway() -> LocalGateway:
    script = Script.parse({"responses": [{"content": "hello from the gateway"}], "loop": True}, where="test")
    with ServerThread(create_scripted_app(script), what="the scripted model server") as model:
        config = GatewayConfig(models={"policy": ModelRoute(model="openai/scripted", api_base=f"{model.url}/v1",
                                                            api_key="unused")})
        with LocalGateway(config) as gw:
            yield gw


@pytest.fixture
async def backend(tmp_path, bundle_cache, gateway):
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache,
                             model_gateway=gateway.model_gateway) as made:
        yield made


@pytest.fixture
async def sandbox(backend):
    async with running(backend, SandboxSpec(network=NetworkPolicy(mode="model"))) as (_, agent):
        yield agent


async def call_inside(agent: AgentSandbox, url: str, key: str, body: dict | None = None) -> tuple[int, str]:
    result = await agent.exec([sys.executable, "-c", CALL, url, key, json.dumps(body) if body else ""])
    assert result.exit_code == 0, result.stderr
    status, _, text = result.stdout.partition("\n")
    return int(status), text


async def reaches(agent: AgentSandbox, host: str, port: int) -> str:
    result = await agent.exec([sys.executable, "-c", CONNECT, host, str(port)])
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


async def test_a_chat_call_from_inside_is_answered_and_recorded_under_its_rollout(sandbox, gateway):
    key = f"rollout-{secrets.token_hex(4)}"
    assert gateway.rollout_base_url(key) == f"{MODEL_GATEWAY_URL}/r/{key}/v1"
    status, text = await call_inside(sandbox, f"{gateway.rollout_base_url(key)}/chat/completions",
                                     gateway.rollout_api_key(key), MODEL)
    assert status == 200, text
    assert json.loads(text)["choices"][0]["message"]["content"] == "hello from the gateway"
    # streamed: the events come through the forwarder as the gateway wrote them
    status, text = await call_inside(sandbox, f"{gateway.rollout_base_url(key)}/chat/completions",
                                     gateway.rollout_api_key(key), {**MODEL, "stream": True})
    assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
    assert "hello from the gateway" in "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in text.splitlines() if line.startswith("data: {"))
    calls = gateway.end_rollout(key)
    assert [call.rollout_key for call in calls] == [key, key]


async def test_a_rollout_key_is_good_for_its_own_rollout_only(sandbox, gateway):
    mine, other = f"mine-{secrets.token_hex(4)}", f"other-{secrets.token_hex(4)}"
    # another rollout's routes: refused, and nothing is billed to it
    status, text = await call_inside(sandbox, f"{gateway.rollout_base_url(other)}/chat/completions",
                                     gateway.rollout_api_key(mine), MODEL)
    assert status == 401 and "its own rollout only" in text
    assert gateway.end_rollout(other) == []
    # nor the gateway's own routes (rollout budgets and records)
    status, _ = await call_inside(sandbox, f"{MODEL_GATEWAY_URL}/v1/rollouts/{mine}", gateway.rollout_api_key(mine))
    assert status == 401
    status, _ = await call_inside(sandbox, f"{MODEL_GATEWAY_URL}/v1/chat/completions",
                                  gateway.rollout_api_key(mine), MODEL)
    assert status == 401


async def test_nothing_but_the_gateway_is_reachable_from_inside(sandbox, gateway):
    with socket.socket() as host_server:  # a service on the host's loopback
        host_server.bind(("127.0.0.1", 0))
        host_server.listen()
        host_port = host_server.getsockname()[1]
        assert await reaches(sandbox, "127.0.0.1", 4000) == "connected"
        assert await reaches(sandbox, "127.0.0.1", host_port) == "ConnectionRefusedError"  # the sandbox's own lo
        # the gateway's (an orchestrator's) TCP port on the host, and the internet
        assert await reaches(sandbox, "127.0.0.1", gateway.port) == "ConnectionRefusedError"
        assert await reaches(sandbox, "1.1.1.1", 80) in ("OSError", "TimeoutError", "ConnectionRefusedError")
    ifaces = await sandbox.exec(["cat", "/proc/net/dev"])
    assert [line.split(":")[0].strip() for line in ifaces.stdout.splitlines()[2:]] == ["lo"]


async def test_a_gateway_without_a_configured_one_is_refused_by_name(tmp_path, bundle_cache):
    backend = LocalBackend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache)
    spec = SandboxSpec(network=NetworkPolicy(mode="model"))
    assert any("model gateway" in phrase for phrase in backend.capabilities.lacks(spec))
    with pytest.raises(InvalidRequest, match="model network without a gateway"):
        await backend.create("nogw", spec, "t" * 16)
    assert not (tmp_path / "sandboxes" / "nogw").exists()


async def test_a_gateway_that_is_not_listening_is_a_clear_error_leaving_nothing(tmp_path, bundle_cache):
    backend = LocalBackend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache,
                           model_gateway=f"unix:{tmp_path}/absent.sock")
    with pytest.raises(BackendError, match="start the gateway"):
        await backend.create("down", SandboxSpec(network=NetworkPolicy(mode="model")), "t" * 16)
    assert not (tmp_path / "sandboxes" / "down").exists()


async def test_open_mode_with_the_gateway_is_routed_through_a_namespace_of_its_own(backend, gateway, remote):
    """`open` shares the host's network namespace, where the sandbox's own 127.0.0.1:4000 cannot exist: with
    the gateway it is routed instead (local/netns.py, as an allowlist of every IPv4 address): the gateway
    answers inside, another machine is reached, and 127.0.0.1 is the sandbox's own."""
    from tests.test_local_allowlist import REMOTE_ADDRESS

    token = secrets.token_hex(16)
    sb = await backend.create(f"o{secrets.token_hex(5)}", SandboxSpec(network=NetworkPolicy(mode="open",
                                                                                           gateway=True)), token)
    async with AgentSandbox(sb.id, sb.agent_url, token) as agent:
        key = f"open-{secrets.token_hex(4)}"
        status, text = await call_inside(agent, f"{gateway.rollout_base_url(key)}/chat/completions",
                                         gateway.rollout_api_key(key), MODEL)
        assert status == 200, text
        assert await reaches(agent, REMOTE_ADDRESS, remote[0]) == "connected"
        assert await reaches(agent, "127.0.0.1", gateway.port) == "ConnectionRefusedError"
    await backend.delete(sb)
    assert gateway.end_rollout(key)


async def test_open_mode_with_the_gateway_is_refused_where_it_cannot_be_routed(backend, monkeypatch):
    from orchard.sandbox.backends.local import netns as local_netns

    monkeypatch.setattr(local_netns, "unavailable_reason", lambda: "it needs root")
    with pytest.raises(InvalidRequest, match="routes the sandbox through a namespace of its own.*it needs root"):
        await backend.create("open", SandboxSpec(network=NetworkPolicy(mode="open", gateway=True)), "t" * 16)


def test_a_tcp_gateway_does_not_fit_the_local_backend(tmp_path):
    with pytest.raises(ValidationError, match="does not fit the local backend"):
        LocalConfig(model_gateway="http://10.0.0.1:4000")
    with pytest.raises(InvalidRequest, match="unix:/PATH"):
        LocalBackend(tmp_path, model_gateway="tcp:127.0.0.1:4000")
    assert LocalBackend(tmp_path, model_gateway="unix:/run/gw.sock").capabilities.model_gateway
    assert not LocalBackend(tmp_path).capabilities.model_gateway


# ---- configuring it ---------------------------------------------------------------------------------------

def test_orchard_serve_sets_the_backends_model_gateway_and_refuses_a_form_that_does_not_fit(tmp_path):
    from typer.testing import CliRunner

    from orchard.cli.main import _backend_config, app
    from orchard.sandbox.backends.registry import create_backend

    config = _backend_config("local", None, tmp_path, f"unix:{tmp_path}/gw.sock")
    assert config.model_gateway == f"unix:{tmp_path}/gw.sock"
    assert create_backend(config).capabilities.model_gateway
    result = CliRunner().invoke(app, ["serve", "--model-gateway", "http://10.0.0.1:4000"],
                                env={"ORCHARD_HOME": str(tmp_path)})
    assert result.exit_code == 2 and "does not fit the local backend" in " ".join(result.output.split())


@pytest.mark.slow
def test_orchard_gateway_also_listens_on_a_unix_socket(tmp_path):
    import subprocess
    import time

    import httpx

    from tests.running_server import free_port

    sock = tmp_path / "gw.sock"
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "orchard.cli.main", "gateway", "--port", str(port),
                                "--socket", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not sock.is_socket() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock), retries=20)) as client:
            response = client.get("http://gateway/r/k/v1/models")
        assert response.status_code == 200 and response.json()["object"] == "list"
        assert sock.stat().st_mode & 0o777 == 0o666  # sandboxes' uids connect; the directory guards it
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        process.terminate()
        process.wait(30)
    assert not sock.exists()


async def test_the_gateway_beside_an_allowlist(backend, gateway):
    """The forwarder listens on the loopback of whatever namespace the sandbox has: with an allowlist's
    too, where the gateway is reachable besides the listed addresses (and the gateway's host port is not)."""
    from orchard.sandbox.backends.local import netns as local_netns

    spec = SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=["192.0.2.1:9"], gateway=True))
    token = secrets.token_hex(16)
    reason = local_netns.unavailable_reason()
    if reason is not None:  # not root, or no ip/nft/nsenter: refused saying why, nothing made
        assert "allowlist" not in backend.capabilities.network_modes
        with pytest.raises(InvalidRequest, match="allowlist"):
            await backend.create(f"a{secrets.token_hex(5)}", spec, token)
        assert await backend.list_live() == []
        return
    sb = await backend.create(f"a{secrets.token_hex(5)}", spec, token)
    agent = AgentSandbox(sb.id, sb.agent_url, token, workdir=spec.workdir)
    try:
        key = f"allow-{secrets.token_hex(4)}"
        status, text = await call_inside(agent, f"{gateway.rollout_base_url(key)}/chat/completions",
                                         gateway.rollout_api_key(key), MODEL)
        assert status == 200, text
        assert len(gateway.end_rollout(key)) == 1
        assert await reaches(agent, "1.1.1.1", 80) != "connected"
    finally:
        await agent.close()
        await backend.delete(sb)
