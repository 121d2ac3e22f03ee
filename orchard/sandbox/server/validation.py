"""Turning pydantic validation errors into one sentence a user can act on."""

from __future__ import annotations

from typing import Any, Iterable

# Where FastAPI says a bad value came from; the user knows the field, not the envelope.
_ENVELOPE = {"body", "query", "path", "header", "cookie"}


def describe_validation_errors(errors: Iterable[dict[str, Any]]) -> str:
    """`[{"loc": ("body", "timeout_s"), "msg": "Input should be greater than 0", ...}]` →
    `"timeout_s: Input should be greater than 0"`; several errors are joined with `; `."""
    parts = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ()) if p not in _ENVELOPE or len(error["loc"]) == 1]
        field = ".".join(loc) or "request"
        message = str(error.get("msg", "invalid value"))
        if error.get("type") == "extra_forbidden":
            message = "unknown field (not allowed here)"
        elif error.get("type") == "json_invalid":  # its loc is a character position, not a field
            field = "body"
            message = f"not valid JSON ({error.get('ctx', {}).get('error', message)})"
        parts.append(f"{field}: {message}")
    return "; ".join(parts) or "the request is invalid"
