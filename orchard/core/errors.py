"""Typed errors a user of Orchard can catch. Each message says what happened and what to do."""

from __future__ import annotations


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


class NotFound(OrchardError):
    """A sandbox, session or path does not exist."""

    code = "not_found"
    status = 404


class SandboxNotFound(NotFound):
    code = "sandbox_not_found"


class PayloadTooLarge(OrchardError):
    code = "too_large"
    status = 413


class ExecTimeout(OrchardError):
    """A command ran past its timeout; its whole process group was killed."""

    code = "exec_timeout"
    status = 408


class SandboxLost(OrchardError):
    """The sandbox died or vanished underneath (killed, evicted, TTL expired, agent unreachable)."""

    code = "sandbox_lost"
    status = 410


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


ERRORS_BY_CODE: dict[str, type[OrchardError]] = {
    cls.code: cls
    for cls in (OrchardError, InvalidRequest, AuthError, NotFound, SandboxNotFound, PayloadTooLarge,
                ExecTimeout, SandboxLost, BackendError, PluginError, ModelError, ModelUnreachable,
                ModelRateLimited, BudgetExceeded)
}


def error_from_code(code: str, message: str) -> OrchardError:
    """Rebuild a typed error from a wire `{"error": code, "message": ...}` body."""
    return ERRORS_BY_CODE.get(code, OrchardError)(message)


def first_problem(errors: list[dict], default: str = "input", *, skip: int = 0) -> str:
    """`field.path: message` for the first of pydantic's `errors()` (what a user fixes first), noting how
    many more there are. `skip` drops leading location parts (e.g. FastAPI's "body")."""
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"][skip:]) or default
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


class GraderError(OrchardError):
    """Grading could not run properly (the test runner did not start, the grading sandbox failed): the
    verdict is unknown. Never a failed attempt of the agent."""

    code = "grader_error"
