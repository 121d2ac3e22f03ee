"""Hand-written checks for JSON request fields (the agent has no pydantic). They mirror the field rules of
the models in orchard/core/sandbox.py and raise 400s that name the field and say what is expected."""

from __future__ import annotations

from .wire import bad_request


def reject_unknown(body: dict, allowed, what: str):
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise bad_request("unknown field(s) %s in %s; allowed: %s"
                          % (", ".join(unknown), what, ", ".join(sorted(allowed))))


def optional_str(body: dict, name: str):
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request("%s must be a string or null, not %s" % (name, type(value).__name__))
    return value


def command(body: dict):
    """A non-empty shell string or a non-empty argv list of strings."""
    value = body.get("command")
    if isinstance(value, str):
        if not value.strip():
            raise bad_request("command must not be empty")
        if "\x00" in value:
            raise bad_request("command must not contain NUL bytes")
        return value
    if isinstance(value, list):
        if not value:
            raise bad_request("command must not be empty")
        if not all(isinstance(arg, str) and "\x00" not in arg for arg in value):
            raise bad_request("command as a list must hold only strings (argv) without NUL bytes")
        return value
    if value is None:
        raise bad_request("command is required: a shell string or an argv list")
    raise bad_request("command must be a string or a list of strings, not %s" % type(value).__name__)


def str_dict(body: dict, name: str) -> dict:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise bad_request("%s must be an object of string keys to string values" % name)
    if any("\x00" in k or "=" in k or not k or "\x00" in v for k, v in value.items()):
        raise bad_request("%s has an invalid variable (empty name, '=' in a name, or a NUL byte)" % name)
    return value


def timeout(body: dict, name: str = "timeout"):
    """Seconds > 0, or None for no timeout."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request("%s must be a number of seconds or null, not %r" % (name, value))
    if not value > 0 or value == float("inf"):
        raise bad_request("%s must be a positive number of seconds, not %r" % (name, value))
    return float(value)


def positive_int(body: dict, name: str, default: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request("%s must be an integer, not %r" % (name, value))
    if value <= 0:
        raise bad_request("%s must be greater than 0, not %d" % (name, value))
    return value
