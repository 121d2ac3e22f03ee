"""The orchestrator's own check that a new sandbox's agent answers on its Pod IP, which is what `create`
waits for instead of the kubelet's Ready condition (that comes up to a second later: the readinessProbe
runs on the kubelet's schedule and its result reaches the API server on the next status sync).

Only the agent is asked, never the API server: between attempts (connection refused while the agent
starts) the Pod's state comes from the watch's cache, so a container that dies or a Pod that is deleted
ends the wait at once with its own error."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import httpx

from orchard.core.errors import BackendError
from orchard.sandbox.backends.kubernetes.watch import is_ready, pod_outcome

# The agent starts in ~0.1-0.3 s once its container runs (more when its CPU limit is tiny); refused
# connections cost the kernel a RST, so start short and back off to a modest ceiling.
FIRST_RETRY_S = 0.01
MAX_RETRY_S = 0.1


async def wait_for_agent(http: httpx.AsyncClient, agent_url: str, name: str,
                         current_pod: Callable[[], object | None], deadline: float) -> None:
    """Return once GET /health answers 200; raise the Pod's own failure, a no-route error (the kubelet
    reached the agent, we cannot) or a timeout at `deadline` (time.monotonic())."""
    delay = FIRST_RETRY_S
    while True:
        pod = current_pod()
        kubelet_reached_it = pod is not None and is_ready(pod)
        try:
            (await http.get(f"{agent_url}/health")).raise_for_status()
            return
        except httpx.HTTPError as e:
            error = e
        pod = current_pod()
        outcome = pod_outcome(pod, deleted=pod is None)
        if isinstance(outcome, BaseException):
            raise outcome
        if kubelet_reached_it:
            raise unreachable(name, agent_url, error)
        if time.monotonic() + delay > deadline:
            raise BackendError(f"the agent of pod {name} did not answer at {agent_url}/health before the "
                               f"create timed out (last error {type(error).__name__}: {error}); "
                               "`kubectl logs` of its sandbox container may say why")
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)


def unreachable(name: str, agent_url: str, error: Exception) -> BackendError:
    return BackendError(
        f"pod {name} is Ready but its agent at {agent_url} cannot be reached from the orchestrator "
        f"({type(error).__name__}: {error}). The orchestrator talks to Pod IPs directly: run it inside the "
        "cluster (deploy/k8s), or add a route to the pod network on this host (e.g. `ip route add "
        "<pod CIDR> via <node IP>`) — see docs/kubernetes.md")


async def wait_agent_gone(agent_url: str, deadline: float) -> bool:
    """Wait until nothing accepts connections at the agent's address: a Pod deleted with grace 0 leaves the
    API at once, while the kubelet stops its containers a moment later, and until then the agent would
    still answer its token. True once gone, False at `deadline` (time.monotonic())."""
    url = httpx.URL(agent_url)
    delay = FIRST_RETRY_S
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(url.host, url.port), 0.5)
        except (OSError, TimeoutError):
            return True
        writer.close()
        if time.monotonic() + delay > deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S * 5)

