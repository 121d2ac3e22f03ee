"""Typed errors a user of Orchard can catch. Each message says what happened and what to do."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class OrchardError(Exception):
    """Base of every error Orchard raises on purpose."""

    code = "error"
    status = 500


class InvalidRequest(OrchardError):
    """The request itself is wrong (bad spec, negative timeout, missing rootfs, ...). Nothing was changed."""

    code = "invalid_request"
    status = 400


class AuthError(OrchardError):
    """The API key or sandbox token was missing or wrong."""

    code = "unauthorized"
    status = 401


class Forbidden(OrchardError):
    """The key is valid but may not do this (an owner key acting for another owner, or on the server)."""

    code = "forbidden"
    status = 403


class NotFound(OrchardError):
    """A sandbox, session or path does not exist."""

    code = "not_found"
    status = 404


class SandboxNotFound(NotFound):
    code = "sandbox_not_found"


class PayloadTooLarge(OrchardError):
    code = "too_large"
    status = 413


class DiskFull(OrchardError):
    """A write into a sandbox found its disk full (its `disk_mb`); nothing of that write was kept."""

    code = "disk_full"
    status = 507


class ExecTimeout(OrchardError):
    """A command ran past its timeout; its whole process group was killed."""

    code = "exec_timeout"
    status = 408


class SandboxLost(OrchardError):
    """The sandbox died or vanished underneath (killed, evicted, TTL expired, agent unreachable)."""

    code = "sandbox_lost"
    status = 410


class PortClosed(OrchardError):
    """Nothing listens on the port asked for inside the sandbox (or the sandbox has no ports of its own)."""

    code = "port_closed"
    status = 502


class BackendError(OrchardError):
    """The backend could not do what was asked (e.g. bubblewrap missing, cluster unreachable)."""

    code = "backend_error"
    status = 503


class PluginError(OrchardError):
    """An installed plugin (e.g. a harness found by entry point) failed to load or is not what it claims."""

    code = "plugin_error"
    status = 500


class ModelError(OrchardError):
    """The model provider behind the gateway failed or answered with an error."""

    code = "model_error"
    status = 502


class ModelUnreachable(ModelError):
    """The model provider could not be reached, or did not answer in time."""

    code = "model_unreachable"
    status = 502


class ModelRateLimited(ModelError):
    """The model provider refused the call for its own rate limit; retry later."""

    code = "model_rate_limited"
    status = 429


class BudgetExceeded(OrchardError):
    """A rollout used up its model-call budget (calls, tokens or wall time) at the gateway."""

    code = "budget_exceeded"
    status = 429


class CapacityExceeded(OrchardError):
    """A create found the orchestrator at one of its caps (live sandboxes, per owner, create rate) and no place
    freed up within its wait. Nothing was created; delete sandboxes or retry later."""

    code = "capacity_exceeded"
    status = 429

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s  # when known (the create rate): HTTP's Retry-After


class IdempotencyConflict(OrchardError):
    """A create reused an idempotency key that an earlier create used with a different spec. Nothing was
    created; use a new key for a new sandbox."""

    code = "idempotency_conflict"
    status = 409


ERRORS_BY_CODE: dict[str, type[OrchardError]] = {
    cls.code: cls
    for cls in (OrchardError, InvalidRequest, AuthError, Forbidden, NotFound, SandboxNotFound, PayloadTooLarge,
                DiskFull, ExecTimeout, SandboxLost, PortClosed, BackendError, PluginError, ModelError,
                ModelUnreachable, ModelRateLimited, BudgetExceeded, CapacityExceeded, IdempotencyConflict)
}


def exception_text(exc: BaseException) -> str:
    """An exception's message, or its type's name when the message is empty (an exception object is
    always true, so `exc or type(exc).__name__` would print nothing for `ConnectError("")`)."""
    return str(exc).strip() or type(exc).__name__


def error_from_code(code: str, message: str) -> OrchardError:
    """Rebuild a typed error from a wire `{"error": code, "message": ...}` body."""
    return ERRORS_BY_CODE.get(code, OrchardError)(message)


# Where FastAPI says a bad value came from; the user knows the field, not the envelope.
_REQUEST_ENVELOPE = frozenset({"body", "query", "path", "header", "cookie"})


def describe_validation_errors(errors: Any, default: str = "input", *, limit: int | None = None) -> str:
    """pydantic's validation errors as one sentence a user can act on: `field.path: message` for each,
    joined with `; `; with `limit`, only the first `limit` (what a user fixes first) and how many more.

    `errors` is a pydantic `ValidationError`, FastAPI's `RequestValidationError`, or their `errors()`.
    A location that is empty (a whole-model check) reads as `default`; FastAPI's envelope ("body",
    "query", ...) is left out of a longer location. An unknown field and invalid JSON get a plain
    message. The one formatter of validation errors in Orchard: callers add their own prefix."""
    if hasattr(errors, "errors"):
        errors = errors.errors()
    errors = list(errors)
    shown = errors if limit is None else errors[:limit]
    parts = []
    for error in shown:
        loc = [str(part) for part in error.get("loc", ())]
        if len(loc) > 1 and loc[0] in _REQUEST_ENVELOPE:
            loc = loc[1:]
        where = ".".join(loc) or default
        message = str(error.get("msg", "invalid value"))
        if error.get("type") == "extra_forbidden":
            message = "unknown field (not allowed here)"
        elif error.get("type") == "json_invalid":  # its loc is a character position, not a field
            where = loc[0] if error.get("loc") and str(error["loc"][0]) in _REQUEST_ENVELOPE else default
            message = f"not valid JSON ({(error.get('ctx') or {}).get('error', message)})"
        parts.append(f"{where}: {message}")
    more = f" (and {len(errors) - len(shown)} more)" if len(errors) > len(shown) else ""
    return ("; ".join(parts) or f"{default}: invalid") + more


def first_problem(errors: Any, default: str = "input") -> str:
    """`describe_validation_errors` of the first error only, noting how many more there are."""
    return describe_validation_errors(errors, default, limit=1)


class ErrorBody(BaseModel):
    """The wire form of an `OrchardError`: the body of every error response of Orchard's HTTP services
    (orchestrator, gateway); `error_from_code` turns it back into the typed error."""

    error: str = Field(description="a code from orchard/core/errors.py, e.g. sandbox_not_found")
    message: str


class GraderError(OrchardError):
    """Grading could not run properly (the test runner did not start, the grading sandbox failed): the
    verdict is unknown. Never a failed attempt of the agent."""

    code = "grader_error"
