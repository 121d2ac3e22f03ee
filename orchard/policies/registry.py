"""Where Orchard's own models are found: the entry points of the group `orchard.models` (the built-in
`oracle` and `smollm2`, and any a plugin package registers), and the policies served at run time
(orchard/policies/live.py, e.g. the model being trained). The gateway's routes, its provider, the evaluator
and `orchard model list` all ask here; nothing imports a policy by name.

Listing reads entry-point metadata only (no import: torch loads on the first `smollm2` call, not here);
the scan is kept per `sys.path`, since the gateway asks for every call. `get_policy(name)` imports and
creates a policy once per process (the entry point's target is a Policy class or factory, called without
arguments, or a ready instance)."""

from __future__ import annotations

import inspect
import sys
import threading
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.policy import ENTRY_POINT_GROUP, PROVIDER_PREFIX, Completion, Policy
from orchard.policies import live

BUILTIN_DISTRIBUTION = "orchard"
LIVE_DESCRIPTION = "served at run time (orchard.policies.live)"

_scan_lock = threading.Lock()
_scanned: tuple[tuple[str, ...], tuple[EntryPoint, ...]] | None = None
_loaded: dict[tuple[str, str, str], Policy] = {}
_load_lock = threading.Lock()


class ModelInfo(BaseModel):
    name: str
    source: Literal["builtin", "plugin", "live"]
    distribution: str | None = Field(default=None, description="the installed package that registers it")
    distribution_version: str | None = Field(default=None, description="that package's version")
    description: str | None = Field(default=None, description="the policy's own description (needs an import)")
    problem: str | None = Field(default=None, description="why the policy could not be loaded")
    target: str | None = Field(default=None, description="the entry point's `module:attr` (none if live)")


def _entries() -> tuple[EntryPoint, ...]:
    global _scanned
    key = tuple(sys.path)
    with _scan_lock:
        if _scanned is None or _scanned[0] != key:
            _scanned = (key, tuple(entry_points(group=ENTRY_POINT_GROUP)))
        return _scanned[1]


def refresh() -> None:
    """Scan the entry points again (a package installed into this process's paths since the last scan)."""
    global _scanned
    with _scan_lock:
        _scanned = None


def model_names() -> list[str]:
    """Every model's name, registered or served at run time, without importing any."""
    return sorted({entry.name for entry in _entries()} | set(live.names()))


def registered_names() -> set[str]:
    """The names registered as entry points (a live policy may not take one)."""
    return {entry.name for entry in _entries()}


def list_models(*, load: bool = False) -> list[ModelInfo]:
    """Every model. With `load`, each is loaded to read its description (a plugin that fails to load is
    listed with the reason); without, nothing is imported."""
    infos = [_info(entry, load=load) for entry in _entries()]
    infos += [ModelInfo(name=name, source="live", description=LIVE_DESCRIPTION) for name in live.names()]
    return sorted(infos, key=lambda info: (info.name, info.distribution or ""))


def get_policy(name: str) -> Policy:
    """The policy served as `name`: a live one, else the one registered under that name."""
    served = live.get(name)
    if served is not None:
        return served if isinstance(served, Policy) else _Served(name, served)
    matches = [entry for entry in _entries() if entry.name == name]
    if not matches:
        raise InvalidRequest(f"unknown model {PROVIDER_PREFIX}{name}: Orchard's own models are "
                             f"{', '.join(model_names()) or 'none'} (a package adds one with an entry point in "
                             f"the {ENTRY_POINT_GROUP!r} group)")
    if len(matches) > 1:
        owners = ", ".join(sorted(f"{_distribution(entry)} ({entry.value})" for entry in matches))
        raise PluginError(f"model {name!r} is registered by more than one package: {owners}; uninstall all but one")
    entry = matches[0]
    key = (entry.name, entry.value, _location(entry))
    with _load_lock:
        policy = _loaded.get(key)
        if policy is None:
            policy = _loaded[key] = _load(entry)
    return policy


def policy_for_route(provider_model: str) -> Policy | None:
    """The policy a gateway route's litellm model (`orchard/<name>`) reaches; None for other providers."""
    if not provider_model.startswith(PROVIDER_PREFIX):
        return None
    return get_policy(provider_model[len(PROVIDER_PREFIX):])


def provider_model(name: str) -> str:
    """The litellm model string the gateway routes `name` to."""
    return f"{PROVIDER_PREFIX}{name}"


def serve_live(name: str, policy: live.LivePolicy) -> str:
    """Serve `policy` (e.g. the model being trained) as the gateway model `orchard/<name>`; returns that
    model string. `withdraw_live(name)` ends it."""
    taken = registered_names()
    if not name or "/" in name or name in taken:
        raise InvalidRequest(f"cannot serve a live policy as {name!r}: use a non-empty name without '/', "
                             f"other than the registered models ({', '.join(sorted(taken))})")
    live.put(name, policy)
    return provider_model(name)


def withdraw_live(name: str) -> None:
    live.withdraw(name)


# --- loading -------------------------------------------------------------------------------------------

def _load(entry: EntryPoint) -> Policy:
    where = f"model {entry.name!r} ({entry.value}, from {_distribution(entry)})"
    try:
        target = entry.load()
    except Exception as exc:  # a plugin's import can fail in any way; report which plugin and why
        raise PluginError(f"{where} failed to import: {type(exc).__name__}: {exc}") from exc
    policy: Any = target
    if inspect.isclass(target) or (callable(target) and not isinstance(target, Policy)):
        try:
            policy = target()
        except Exception as exc:
            raise PluginError(f"{where} could not be created: {type(exc).__name__}: {exc}") from exc
    if not isinstance(policy, Policy) or not callable(policy.complete):
        raise PluginError(f"{where} is not a Policy: it needs `name`, `description`, `blocking` and "
                          f"`complete(messages, tools, params, *, rollout_key, timeout_s)`; got {type(policy).__name__}")
    if policy.name != entry.name:
        raise PluginError(f"{where} calls itself {policy.name!r}; its entry point name and its `name` must match, "
                          "since calls are recorded under the name")
    return policy


def _distribution(entry: EntryPoint) -> str | None:
    return entry.dist.name if entry.dist is not None else None


def _location(entry: EntryPoint) -> str:
    return str(entry.dist.locate_file("")) if entry.dist is not None else ""


def _info(entry: EntryPoint, *, load: bool) -> ModelInfo:
    distribution = _distribution(entry)
    description, problem = None, None
    if load:
        try:
            description = get_policy(entry.name).description
        except Exception as exc:  # a plugin's import can fail in any way: listed with the reason
            problem = f"{type(exc).__name__}: {exc}"
    return ModelInfo(
        name=entry.name, source="builtin" if distribution == BUILTIN_DISTRIBUTION else "plugin",
        distribution=distribution, distribution_version=entry.dist.version if entry.dist is not None else None,
        description=description, problem=problem, target=entry.value)


@dataclass(frozen=True)
class _Served:
    """A live policy that only has `complete` (e.g. the trainer's), as a Policy under its served name."""

    name: str
    policy: live.LivePolicy
    description: str = LIVE_DESCRIPTION
    blocking: bool = field(default=True)  # generation: off the gateway's event loop

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: dict[str, Any],
                 *, rollout_key: str | None, timeout_s: float | None) -> Completion:
        return self.policy.complete(messages, tools, params, rollout_key=rollout_key, timeout_s=timeout_s)
