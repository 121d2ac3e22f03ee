"""Warm pools on the Kubernetes backend against a real cluster (the dev cluster of scripts/k8s/cluster.sh):
members are Pods, a claim reaches the member's agent at its Pod IP, stop deletes the unclaimed Pods."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest

from orchard.core.errors import AuthError
from orchard.core.pool import PoolSpec
from orchard.core.sandbox import SandboxSpec
from tests.test_k8s_backend import BASE_IMAGE, _backend, namespace  # noqa: F401 (a fixture; the others: conftest.py's)

pytestmark = pytest.mark.k8s


async def test_a_pool_of_pods_is_claimed_with_a_fresh_token_and_env_and_stop_deletes_the_rest(
        kubeconfig, agent_image, namespace):  # noqa: F811
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.server.service import SandboxService
    from orchard.sandbox.server.store import SandboxStore

    instance = f"p{secrets.token_hex(4)}"
    spec = SandboxSpec(image=BASE_IMAGE, cpu=0.1, memory_mb=64, max_processes=None)
    service = SandboxService(_backend(kubeconfig, agent_image, namespace, instance), SandboxStore(":memory:"),
                             pools=[PoolSpec(name="pods", spec=spec, min_ready=2)])
    await service.start()
    try:
        deadline = time.monotonic() + 180
        while service.pools.status()[0].idle < 2:
            assert time.monotonic() < deadline, f"the pool never filled: {service.pools.status()}"
            await asyncio.sleep(0.1)
        members = {r.info.id: r.info.token for r in service.store.list(states=("ready",))}
        info = await service.create(spec.model_copy(update={"env": {"WHO": "k8s"}, "labels": {"t": "pool"}}),
                                    owner="dora")
        assert info.pool.claimed and info.id in members and info.token != members[info.id]
        assert info.agent_url.startswith("http://")
        async with AgentSandbox(info.id, info.agent_url, info.token) as sandbox:
            assert (await sandbox.exec("echo $WHO")).stdout == "k8s\n"
        async with AgentSandbox(info.id, info.agent_url, members[info.id]) as with_pool_token:
            with pytest.raises(AuthError):
                await with_pool_token.exec("true")
        await service.delete(info.id)
    finally:
        await service.stop()
    leftover = _backend(kubeconfig, agent_image, namespace, instance)
    try:
        assert await leftover.list_live() == []  # every unclaimed member's Pod was deleted on stop
    finally:
        await leftover.close()
