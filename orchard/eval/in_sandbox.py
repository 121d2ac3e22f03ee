"""Harnesses that run *inside* the task's sandbox: what the evaluator does for them.

A harness says so by naming its harness bundle (`bundle = "kimi-cli"`, a spec registered in
`orchard.harness_bundles`, docs/harness-bundles.md). For such a harness the evaluator

- builds the bundle before the run (once; it is cached) into the cache the sandboxes' backend mounts from;
- serves the run's gateway to the sandboxes: the backend's `model_gateway` is this run's gateway, whatever
  the backend's own config said, since only this gateway records the run's calls: its Unix socket for
  backends that bind one in (local, docker), else its TCP port on an address of this machine the sandboxes
  reach (`ORCHARD_GATEWAY_HOST`, e.g. a Kubernetes node's IP; the dev cluster's `cluster.sh env` sets it);
- creates each agent sandbox with the bundle mounted (`spec.bundles`) and `network.gateway` on; the task's
  own network mode still applies to everything else;
- hands the harness a `ModelConfig` as seen from inside: base URL `http://127.0.0.1:4000/r/<rollout key>/v1`
  and an API key good for that rollout only, so a harness (or whatever the agent runs) cannot bill or read
  another rollout.

The grader's sandbox gets none of this: grading needs neither the harness nor the model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import SecretStr, ValidationError

from orchard.core.backend import BackendConfig
from orchard.core.errors import InvalidRequest
from orchard.core.harness import Harness, ModelConfig
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.task import Task
from orchard.eval.local_gateway import LocalGateway
from orchard.sandbox.harness_bundles.build import ensure_bundle
from orchard.sandbox.harness_bundles.store import BuiltBundle
from orchard.sandbox.server.home import resolve_home, resolved_backend_config

GATEWAY_HOST_ENV = "ORCHARD_GATEWAY_HOST"


def harness_bundle(harness: Harness) -> str | None:
    """The harness bundle `harness` runs from (None for a harness that runs in Orchard's own process)."""
    name = getattr(harness, "bundle", None)
    if name is not None and not isinstance(name, str):
        raise InvalidRequest(f"harness {harness.name!r}: `bundle` must be the name of a harness bundle, "
                             f"not {type(name).__name__}")
    return name or None


def bundle_cache_dir(config: BackendConfig, home: Path | None = None) -> Path:
    """Where the backend configured by `config` finds built bundles (its agent-bundle cache)."""
    configured = getattr(config, "bundle_cache_dir", None)
    return Path(configured) if configured else resolve_home(home) / "cache"


def ensure_run_bundle(name: str, config: BackendConfig, progress: Callable[[str], None] = lambda step: None
                      ) -> BuiltBundle:
    """The bundle `name`, built now if it is not yet (minutes for a large harness, then cached)."""
    return ensure_bundle(get_bundle_spec(name), bundle_cache_dir(config), progress)


def backend_for_run(backend: BackendConfig | str | None, orchard_url: str | None, has_client: bool) -> BackendConfig:
    """The backend config an in-sandbox harness's run uses. Refused where the run cannot hand its own
    gateway to the sandboxes: a server's or a caller's orchestrator was configured without it."""
    if has_client or orchard_url:
        where = "the given Orchard client" if has_client else f"the server at {orchard_url}"
        raise InvalidRequest(f"an in-sandbox harness (or a task's simulated user) needs sandboxes that reach this "
                             f"run's model gateway, which {where} cannot be told about; run with the embedded "
                             "orchestrator (`--backend`, no ORCHARD_URL)")
    return resolved_backend_config(backend, resolve_home())


def gateway_host(config: BackendConfig, environ: Mapping[str, str] = os.environ) -> str:
    """The address the run's gateway listens on: loopback when the backend's sandboxes reach it through
    its Unix socket, else `ORCHARD_GATEWAY_HOST`."""
    if _takes_socket(config):
        return "127.0.0.1"
    host = environ.get(GATEWAY_HOST_ENV, "").strip()
    if not host:
        raise InvalidRequest(f"the {config.backend} backend's sandboxes reach this run's model gateway over the "
                             f"network: set {GATEWAY_HOST_ENV} to an address of this machine they reach (for the "
                             "dev cluster, `eval \"$(bash scripts/k8s/cluster.sh env)\"` sets it)")
    return host


def with_run_gateway(config: BackendConfig, gateway: LocalGateway) -> BackendConfig:
    """`config` with `model_gateway` set to this run's gateway, as its backend's sandboxes reach it."""
    where = gateway.model_gateway if _takes_socket(config) else f"http://{gateway.host}:{gateway.port}"
    if where is None:
        raise InvalidRequest("the run's gateway listens on no Unix socket, so no sandbox can reach it")
    try:
        return _with(config, where)
    except ValidationError as exc:
        raise InvalidRequest(f"the {config.backend} backend cannot take this run's gateway at {where}: "
                             f"{exc.errors()[0]['msg']}") from None


def _takes_socket(config: BackendConfig) -> bool:
    """Whether the backend reaches a gateway through its Unix socket (it binds it into sandboxes)."""
    try:
        _with(config, "unix:/run/gateway.sock")
    except ValidationError:
        return False
    return True


def _with(config: BackendConfig, model_gateway: str) -> BackendConfig:
    return type(config).model_validate({**config.model_dump(), "model_gateway": model_gateway})


def sandbox_overrides(task: Task, bundle: str) -> dict[str, Any]:
    """The agent sandbox's spec fields for an in-sandbox harness: its bundle, and the gateway on top of the
    task's own network."""
    return {"bundles": [bundle], "network": task.environment.network.model_copy(update={"gateway": True})}


def inside_model(model: ModelConfig, gateway: LocalGateway) -> ModelConfig:
    """`model` as a harness inside the sandbox reaches it: the rollout's own URL and key."""
    assert model.rollout_key is not None
    return model.model_copy(update={
        "base_url": gateway.rollout_base_url(model.rollout_key, inside=True),
        "api_key": SecretStr(gateway.rollout_api_key(model.rollout_key))})
