"""The Claw services by name, their default ports, and how one is made from its seed. Standard library only."""

from __future__ import annotations

import importlib
import json
import os

from .base import SEED_FILE, SeedError, Service, load_seed
from .faults import FaultPlan

SERVICES = {"mail": "mail:Mail", "calendar": "calendar:Calendar", "contacts": "contacts:Contacts",
            "notes": "notes:Notes", "todo": "todo:Todo", "user": "user:User"}  # module (of this package):class
PORTS = {"mail": 8101, "calendar": 8102, "contacts": 8103, "notes": 8104, "todo": 8105, "user": 8106}
SMTP_PORT = 8125


def service_class(name: str) -> type[Service]:
    if name not in SERVICES:
        raise SeedError(f"there is no Claw service {name!r}; the services: {', '.join(SERVICES)}")
    module, cls = SERVICES[name].split(":")
    return getattr(importlib.import_module("." + module, __package__), cls)


def check_seed(name: str, seed: dict, user: dict | None = None) -> dict:
    """The state `seed` gives service `name`; SeedError saying what is wrong with it."""
    return service_class(name)(seed, user=user).state


def make_service(name: str, *, seed_path: str | None = None, state_dir: str | None = None,
                 environ: dict | None = None) -> Service:
    """The service as `serve` runs it: its seed from `seed_path` (default: seed.json in the state directory),
    the world's clock, user and faults from CLAW_NOW, CLAW_USER and CLAW_FAULTS (the user service: its model
    from USER_MODEL_ENV)."""
    environ = os.environ if environ is None else environ
    state_dir = state_dir or os.getcwd()
    seed = load_seed(seed_path or os.path.join(state_dir, SEED_FILE))
    user = json.loads(environ["CLAW_USER"]) if environ.get("CLAW_USER") else None
    service = service_class(name)(seed, now=environ.get("CLAW_NOW") or "2026-03-02T09:00", user=user,
                                  faults=FaultPlan.from_json(environ.get("CLAW_FAULTS")), state_dir=state_dir)
    if hasattr(service, "use_model"):  # the user: a model the evaluator handed over (user.py)
        service.use_model(environ)
    return service
