"""The pure steps of a create (service.py): a new sandbox's id, its spec validated again, its startup timings."""

from __future__ import annotations

import secrets

from pydantic import ValidationError

from orchard.core.backend import BackendSandbox
from orchard.core.errors import InvalidRequest, describe_validation_errors
from orchard.core.sandbox import SandboxSpec, StartupTimings


def new_sandbox_id() -> str:
    return f"sb-{secrets.token_hex(6)}"


def startup_timings(made: BackendSandbox, started: float, admitted_at: float, ready_at: float) -> StartupTimings:
    """The stages of one create: the admission wait and the whole as the service timed them, the backend's
    own stages as it reported them (else its whole create as one stage)."""
    total_ms, backend_ms = (ready_at - started) * 1000, (ready_at - admitted_at) * 1000
    reported = made.timings
    stages = reported.model_dump(exclude={"total_ms", "admission_wait_ms", "pool_claim_ms"}) if reported else {}
    if not any(v is not None for v in stages.values()):
        stages = {"backend_create_ms": backend_ms}
    return StartupTimings(admission_wait_ms=(admitted_at - started) * 1000, total_ms=total_ms, **stages)


def validated_spec(spec: SandboxSpec | dict) -> SandboxSpec:
    """Validate again: a spec built with `model_construct` or changed after creation skipped validation."""
    try:
        data = spec.model_dump() if isinstance(spec, SandboxSpec) else spec
        return SandboxSpec.model_validate(data)
    except ValidationError as e:
        raise InvalidRequest(f"invalid sandbox spec: {describe_validation_errors(e.errors())}") from e
