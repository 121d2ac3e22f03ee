"""Model-only networking on the docker backend, on the real daemon (scripts/docker/daemon.sh; `docker`
marker): the gateway's Unix socket bound into the container and the agent's forwarder at 127.0.0.1:4000,
with network `none` (no interface but loopback) and beside the bridge (`open`: the container still has a
loopback of its own). The gateway is the evaluation's own (LocalGateway) with the scripted model behind it."""

from __future__ import annotations

import json
import secrets

import pytest
from pydantic import ValidationError

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import NetworkPolicy, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.docker.config import DockerConfig
from tests.docker_daemon import TEST_IMAGE, require_daemon
from tests.test_model_network import CALL, CONNECT, MODEL, gateway  # noqa: F401 — the module's gateway fixture

pytestmark = pytest.mark.docker


@pytest.fixture
async def docker(short_tmp, gateway):
    from orchard.sandbox.backends.docker import DockerBackend

    backend = DockerBackend(DockerConfig(base_url=require_daemon(), instance=f"t{secrets.token_hex(4)}",
                                         default_image=TEST_IMAGE, pull="never", run_dir=short_tmp / "run",
                                         model_gateway=gateway.model_gateway))
    yield backend
    for found in await backend.list_live():
        await backend.delete(found)
    await backend.close()


@pytest.mark.parametrize("mode", ["none", "open"])
async def test_the_gateway_answers_inside_a_container_for_its_rollout(docker, gateway, mode):
    token = secrets.token_hex(16)
    made = await docker.create(f"g{secrets.token_hex(5)}", SandboxSpec(
        image=TEST_IMAGE, network=NetworkPolicy(mode=mode, gateway=True)), token)
    agent = AgentSandbox(made.id, made.agent_url, token)
    try:
        key, other = f"docker-{secrets.token_hex(4)}", f"other-{secrets.token_hex(4)}"
        for rollout, expected in ((key, 200), (other, 401)):
            result = await agent.exec(["python3", "-c", CALL, f"{gateway.rollout_base_url(rollout)}/chat/completions",
                                       gateway.rollout_api_key(key), json.dumps(MODEL)])
            assert result.exit_code == 0 and result.stdout.startswith(f"{expected}\n"), result
        assert len(gateway.end_rollout(key)) == 1 and gateway.end_rollout(other) == []
        if mode == "none":
            result = await agent.exec(["python3", "-c", CONNECT, "1.1.1.1", "80"])
            assert result.stdout.strip() != "connected"
    finally:
        await agent.close()
        await docker.delete(made)


def test_a_tcp_gateway_does_not_fit_the_docker_backend():
    with pytest.raises(ValidationError, match="does not fit the docker backend"):
        DockerConfig(model_gateway="http://10.0.0.1:4000")


async def test_without_a_gateway_the_spec_is_refused(tmp_path):
    from orchard.sandbox.backends.docker import DockerBackend

    backend = DockerBackend(DockerConfig(base_url=require_daemon(), run_dir=tmp_path / "run", pull="never"))
    try:
        with pytest.raises(InvalidRequest, match="model gateway"):
            await backend.create("nogw", SandboxSpec(image=TEST_IMAGE, network=NetworkPolicy(mode="model")), "t")
        assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*nogw*"))
    finally:
        await backend.close()
