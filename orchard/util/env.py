"""Reading settings given as environment variables."""

from __future__ import annotations

from orchard.core.errors import InvalidRequest

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def env_flag(value: str | None, name: str) -> bool | None:
    """The on/off setting `value` of the variable `name` (1/true/yes/on or 0/false/no/off, any case); None
    when unset. Anything else is an InvalidRequest naming the variable."""
    if value is None:
        return None
    if value.lower() in _ON:
        return True
    if value.lower() in _OFF:
        return False
    raise InvalidRequest(f"{name}={value!r}: use 1 (on) or 0 (off)")
