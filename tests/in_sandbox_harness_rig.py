"""What the tests of in-sandbox harnesses (kimi-cli, openhands, cli, the probe of tests/test_eval_in_sandbox.py)
share: an Orchard home holding a harness's bundle, the trajectories of a run, a gateway route to a model that
is not there, the check that an agent step is the reply the gateway recorded, and a run's Kubernetes
namespace on the dev cluster (set up, then checked empty and deleted)."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import LLMCall, Step, Trajectory
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.gateway.config import GatewayConfig, ModelRoute

if TYPE_CHECKING:
    from orchard.sandbox.backends.kubernetes.config import KubernetesConfig


def home_fixtures(bundle: str) -> tuple[Any, Any]:
    """The fixtures of a module that runs `bundle`'s harness, to be bound as `bundle_home, home = ...`:
    `bundle_home`, an Orchard home whose cache (the session's) holds the bundle, built once per session (the
    downloads kept between sessions), and `home`, that home set as ORCHARD_HOME for a test."""

    @pytest.fixture(scope="session")
    def bundle_home(tmp_path_factory, session_bundles) -> Path:
        """An Orchard home whose cache (the session's) holds the bundle."""
        return session_bundles.home(tmp_path_factory.mktemp(f"{bundle}-home"), bundle)

    @pytest.fixture
    def home(bundle_home, monkeypatch) -> Path:
        """`bundle_home`, this test's ORCHARD_HOME."""
        monkeypatch.setenv("ORCHARD_HOME", str(bundle_home))
        return bundle_home

    return bundle_home, home


def run_trajectories(out: Path) -> list[Trajectory]:
    """The trajectories a run wrote to `out`, whole (no interrupted tail)."""
    return list(read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False))


def unreachable_model(alias: str = "down") -> GatewayConfig:
    """A gateway config whose one route, `alias`, leads to a local port nothing listens on: every model call
    fails."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    return GatewayConfig(models={alias: ModelRoute(model=f"openai/{alias}", api_base=f"http://127.0.0.1:{dead}/v1",
                                                   api_key="unused")})


def replies_by_id(trajectory: Trajectory) -> dict[str, LLMCall]:
    """The trajectory's gateway calls that have a reply, by the reply's response id."""
    return {call.response["id"]: call for call in trajectory.llm_calls if call.response}


def check_step_is_reply(step: Step, call: LLMCall) -> None:
    """`step` is `call`'s reply: same text, same tool calls as the model wrote them; each tool call has its
    result."""
    message = call.response["choices"][0]["message"]
    assert step.message == (message.get("content") or "")
    assert [(c.tool_call_id, c.function_name, c.raw_arguments) for c in step.tool_calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    for tool_call in step.tool_calls:
        assert tool_call.tool_call_id in [r.source_call_id for r in step.observation.results]


@contextmanager
def k8s_run(home: Path, bundle: str) -> Iterator[KubernetesConfig]:
    """A Kubernetes backend config for a run on the dev cluster (skips without one; tests/k8s_cluster.py) in
    a namespace of its own: `bundle`'s harness image imported from `home`'s cache, the agent-injector image
    built and imported. On leaving without an error no Pod may be left in the namespace; it is deleted
    either way."""
    from tests.k8s_cluster import (
        CLUSTER_SCRIPT,
        POD_PIDS_LIMIT,
        delete_namespace,
        require_cluster,
    )

    kubeconfig = require_cluster()
    from orchard.sandbox.backends.kubernetes.config import KubernetesConfig
    from orchard.sandbox.backends.kubernetes.harness_images import import_harness_image
    from orchard.sandbox.backends.kubernetes.images import import_injector_image
    from orchard.sandbox.harness_bundles.store import read_built

    import_harness_image(CLUSTER_SCRIPT, read_built(home / "cache", get_bundle_spec(bundle)))
    namespace = f"orchard-test-{secrets.token_hex(3)}"
    config = KubernetesConfig(namespace=namespace, instance=f"t{secrets.token_hex(4)}", image_pull_policy="Never",
                              agent_image=import_injector_image(CLUSTER_SCRIPT), kubeconfig=kubeconfig,
                              bundle_cache_dir=home / "cache", pod_pids_limit=POD_PIDS_LIMIT)
    try:
        yield config
        _check_no_pods(kubeconfig, namespace)
    finally:
        delete_namespace(kubeconfig, namespace, missing_ok=True)


def _check_no_pods(kubeconfig: str, namespace: str) -> None:
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    api = load_api_client(kubeconfig)
    try:
        assert client.CoreV1Api(api).list_namespaced_pod(namespace).items == []
    finally:
        api.close()
