"""Harnesses that run *inside* the task's sandbox: what the evaluator does for them.

A harness says so by naming its harness bundle (`bundle = "kimi-cli"`, a spec registered in
`orchard.harness_bundles`, docs/harness-bundles.md). For such a harness the evaluator

- builds the bundle before the run (once; it is cached) into the cache the sandboxes' backend mounts from;
- serves the run's gateway to the sandboxes: the backend's `model_gateway` is this run's gateway (its Unix
  socket for backends on this machine), whatever the backend's own config said, since only this gateway
  records the run's calls;
- creates each agent sandbox with the bundle mounted (`spec.bundles`) and `network.gateway` on; the task's
  own network mode still applies to everything else;
- hands the harness a `ModelConfig` as seen from inside: base URL `http://127.0.0.1:4000/r/<rollout key>/v1`
  and an API key good for that rollout only, so a harness (or whatever the agent runs) cannot bill or read
  another rollout.

The grader's sandbox gets none of this: grading needs neither the harness nor the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

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
        raise InvalidRequest(f"an in-sandbox harness needs sandboxes that reach this run's model gateway, which "
                             f"{where} cannot be told about; run with the embedded orchestrator (`--backend`, "
                             "no ORCHARD_URL)")
    return resolved_backend_config(backend, resolve_home())


def with_run_gateway(config: BackendConfig, gateway: LocalGateway) -> BackendConfig:
    """`config` with `model_gateway` set to this run's gateway, as its backend reaches it."""
    if gateway.model_gateway is None:
        raise InvalidRequest("the run's gateway listens on no Unix socket, so no sandbox can reach it")
    try:
        return type(config).model_validate({**config.model_dump(), "model_gateway": gateway.model_gateway})
    except ValidationError as exc:
        raise InvalidRequest(f"the {config.backend} backend cannot reach this run's gateway through its Unix "
                             f"socket ({exc.errors()[0]['msg']}); in-sandbox harnesses run on backends on "
                             "this machine (local, docker)") from None


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
