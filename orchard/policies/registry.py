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
import threading
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any

from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.plugins import PluginInfo, Registry, check_name, is_import_path
from orchard.core.policy import ENTRY_POINT_GROUP, PROVIDER_PREFIX, Completion, Policy
from orchard.policies import live

LIVE_DESCRIPTION = "served at run time (orchard.policies.live)"

MODELS = Registry("model", ENTRY_POINT_GROUP, "docs/models.md", cached=True)
_loaded: dict[tuple[str, str, str], Policy] = {}
_load_lock = threading.Lock()


def refresh() -> None:
    """Scan the entry points again (a package installed into this process's paths since the last scan)."""
    MODELS.refresh()


def model_names() -> list[str]:
    """Every model's name, registered or served at run time, without importing any."""
    return sorted(set(MODELS.names()) | set(live.names()))


def registered_names() -> set[str]:
    """The names registered as entry points (a live policy may not take one)."""
    return set(MODELS.names())


def list_models(*, load: bool = False) -> list[PluginInfo]:
    """Every model. With `load`, each is loaded to read its description (`detail`; a plugin that fails to
    load is listed with the reason); without, nothing is imported."""
    infos = [_info(entry, load=load) for entry in MODELS.entries()]
    infos += [PluginInfo(kind="model", name=name, source="live", detail=LIVE_DESCRIPTION) for name in live.names()]
    return sorted(infos, key=lambda info: (info.name, info.distribution or ""))


def get_policy(name: str) -> Policy:
    """The policy served as `name`: a live one, else the one registered under that name."""
    served = live.get(name)
    if served is not None:
        return served if isinstance(served, Policy) else _Served(name, served)
    if not is_import_path(name) and name not in MODELS.names():
        raise InvalidRequest(f"unknown model {PROVIDER_PREFIX}{name}: Orchard's own models are "
                             f"{', '.join(model_names()) or 'none'} (a package adds one with an entry point in "
                             f"the {ENTRY_POINT_GROUP!r} group, or name your own class as module:Class)")
    entry = MODELS.entry(name)  # refuses a name two packages register
    key = (name, entry.value, _location(entry))
    with _load_lock:
        policy = _loaded.get(key)
        if policy is None:
            policy = _loaded[key] = _load(name)
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

def _load(name: str) -> Policy:
    target, entry = MODELS.load(name)
    where = MODELS.where(entry)
    policy: Any = target
    if inspect.isclass(target) or (callable(target) and not isinstance(target, Policy)):
        try:
            policy = target()
        except Exception as exc:
            raise PluginError(f"{where} could not be created: {type(exc).__name__}: {exc}") from exc
    if not isinstance(policy, Policy) or not callable(policy.complete):
        raise PluginError(f"{where} is not a Policy: it needs `name`, `description`, `blocking` and "
                          f"`complete(messages, tools, params, *, rollout_key, timeout_s)`; got {type(policy).__name__}")
    check_name(MODELS, entry, policy.name)
    return policy


def _location(entry: EntryPoint) -> str:
    return str(entry.dist.locate_file("")) if entry.dist is not None else ""


def _info(entry: EntryPoint, *, load: bool) -> PluginInfo:
    description, problem = None, None
    if load:
        try:
            description = get_policy(entry.name).description
        except Exception as exc:  # a plugin's import can fail in any way: listed with the reason
            problem = f"{type(exc).__name__}: {exc}"
    return MODELS.info(entry, detail=description, problem=problem)


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
