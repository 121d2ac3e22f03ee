"""The model gateway's Unix socket, attacked from a real local sandbox with `network.mode = "model"`: its
workload connects straight to the socket bound into it (past the agent's forwarder and its cap) and holds
stalled connections. The gateway used to keep every one of them (2,550 in the report) for as long as the
sandbox liked. Now one sandbox (one network namespace) holds at most `max_connections_per_sandbox`: past it
its own oldest idle connection is closed; a connection that sends no whole request within
`connection_idle_timeout_s` is closed; and a normal model call from the same sandbox still works."""

from __future__ import annotations

import json
import secrets
import sys

import pytest

from orchard.core.sandbox import NetworkPolicy, SandboxSpec
from orchard.eval.local_gateway import LocalGateway
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.sandbox.backends.local.bwrap import GATEWAY_SOCKET
from orchard.testing.scripted_model import create_scripted_app
from orchard.testing.scripted_script import Script
from orchard.util.uvicorn_thread import ServerThread
from tests.local_backend_rig import local_backend, running

CAP = 4
IDLE_TIMEOUT_S = 5.0
STALLED = 12
# Inside the sandbox: open STALLED connections straight to the gateway's socket and send half a request on
# each; make one normal model call through 127.0.0.1:4000 while they are held; then report how many of the
# stalled ones the gateway closed, once right after the call and once after they had time to time out.
ATTACK = r"""
import json, select, socket, sys, time, urllib.request
path, stalled, url, key, idle = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
held = []
for _ in range(stalled):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")  # and never the rest
    held.append(s)

def closed():
    n = 0
    for s in held:
        try:
            n += bool(select.select([s], [], [], 0)[0] and s.recv(1, socket.MSG_PEEK) == b"")
        except ConnectionResetError:
            n += 1
    return n

time.sleep(0.2)
closed_early = closed()  # well before the idle timeout: only the cap closed these
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(url, data=body, headers={"Authorization": "Bearer " + key,
                                                          "Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as response:
    answer = json.loads(response.read())["choices"][0]["message"]["content"]
closed_at_once = closed()
deadline = time.monotonic() + idle * 15
while closed() < stalled and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"answer": answer, "closed_early": closed_early, "closed_at_once": closed_at_once,
                  "closed_later": closed()}))
"""


@pytest.fixture(scope="module")
def gateway():
    script = Script.parse({"responses": [{"content": "still answered"}], "loop": True}, where="test")
    with ServerThread(create_scripted_app(script), what="the scripted model server") as model:
        config = GatewayConfig(models={"policy": ModelRoute(model="openai/scripted", api_base=f"{model.url}/v1",
                                                            api_key="unused")},
                               max_connections_per_sandbox=CAP, connection_idle_timeout_s=IDLE_TIMEOUT_S)
        with LocalGateway(config) as gw:
            yield gw


@pytest.fixture
async def sandbox(tmp_path, bundle_cache, gateway):
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache,
                             model_gateway=gateway.model_gateway) as backend:
        async with running(backend, SandboxSpec(network=NetworkPolicy(mode="model"))) as (_, agent):
            yield agent


async def test_a_sandbox_cannot_hold_the_gateways_socket(sandbox, gateway):
    rollout = f"rollout-{secrets.token_hex(4)}"
    result = await sandbox.exec([sys.executable, "-c", ATTACK, GATEWAY_SOCKET, str(STALLED),
                                 f"{gateway.rollout_base_url(rollout)}/chat/completions",
                                 gateway.rollout_api_key(rollout), str(IDLE_TIMEOUT_S)], timeout=120)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["answer"] == "still answered"  # the sandbox's own call got through its stalled ones
    # past the cap, the sandbox's oldest idle connections made way (the call's own one took a place too)
    assert report["closed_early"] >= STALLED - CAP, report
    assert report["closed_at_once"] >= STALLED - CAP + 1, report
    assert report["closed_later"] == STALLED, report  # the rest timed out
    assert [call.rollout_key for call in gateway.end_rollout(rollout)] == [rollout]
