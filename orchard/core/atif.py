"""Orchard trajectories <-> plain ATIF JSON documents.

`to_atif` writes only ATIF fields; each object's Orchard-only fields (`ORCHARD_FIELDS`) that differ from
their defaults go into that object's `extra["orchard"]`. `from_atif` reverses this, so
`from_atif(to_atif(t)) == t`, and it reads plain ATIF (v1.0-v1.7) written by other tools, where absent
fields and nulls take Orchard's defaults. Both walk the pydantic models' own field declarations, so a field
added to `trajectory.py` is carried without touching this file."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from orchard.core.errors import InvalidRequest
from orchard.core.trajectory import ORCHARD_EXTRA_KEY, AtifObject, ExtensibleAtifObject, Trajectory

# Required by ATIF but defaulted in Orchard's models: always written, even when equal to the default.
_ALWAYS_WRITTEN = frozenset({"schema_version", "session_id", "steps", "message", "arguments", "results"})


def to_atif(trajectory: Trajectory) -> dict[str, Any]:
    """The trajectory as a plain ATIF document (a JSON-ready dict)."""
    return _export(trajectory)


def from_atif(document: Mapping[str, Any] | str | bytes) -> Trajectory:
    """Read an ATIF document (a dict, or its JSON text): Orchard's own exports or any other tool's."""
    if isinstance(document, (str, bytes)):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise InvalidRequest(f"ATIF document is not valid JSON: {exc}") from None
    if not isinstance(document, Mapping):
        raise InvalidRequest(f"an ATIF document is a JSON object, got {type(document).__name__}")
    # A private copy: nested JSON values (tool arguments, extras) must not stay shared with the caller's.
    fields = _import(Trajectory, copy.deepcopy(document), "trajectory")
    try:
        return Trajectory.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(f"not a valid ATIF trajectory: {_describe(exc)}") from None


def _export(model: BaseModel) -> dict[str, Any]:
    cls = type(model)
    orchard_fields = getattr(cls, "ORCHARD_FIELDS", frozenset())
    out: dict[str, Any] = {}
    orchard: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if name == "extra":
            continue
        value = getattr(model, name)
        if name in orchard_fields:
            if value != field.get_default(call_default_factory=True):
                orchard[name] = _plain(value)
            continue
        if value is None:
            continue
        if name not in _ALWAYS_WRITTEN and not field.is_required() \
                and value == field.get_default(call_default_factory=True):
            continue  # an optional ATIF field at its default: absent in ATIF means the same
        out[name] = _export_value(value)
    if isinstance(model, ExtensibleAtifObject):
        extra = copy.deepcopy(model.extra)
        if orchard:
            extra[ORCHARD_EXTRA_KEY] = orchard
        if extra:
            out["extra"] = extra
    elif orchard:  # an Orchard field on an ATIF object without `extra` would be lost: a schema bug
        raise TypeError(f"{cls.__name__} declares Orchard fields but has no `extra` to carry them")
    return out


def _export_value(value: Any) -> Any:
    if isinstance(value, AtifObject):
        return _export(value)
    if isinstance(value, list):
        return [_export_value(item) for item in value]
    return copy.deepcopy(value)


def _plain(value: Any) -> Any:
    """An Orchard-only value as JSON-ready data; it is validated back by its own model on import, where
    left-out defaults come back."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return copy.deepcopy(value)


def _import(cls: type[AtifObject], data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """ATIF object -> the field values of `cls`, Orchard fields lifted out of `extra`."""
    fields = {key: value for key, value in data.items() if value is not None}  # null = absent in ATIF
    if issubclass(cls, ExtensibleAtifObject) and isinstance(fields.get("extra"), Mapping):
        extra = dict(fields["extra"])
        orchard = extra.pop(ORCHARD_EXTRA_KEY, None)
        fields["extra"] = extra
        if orchard is not None:
            if not isinstance(orchard, Mapping):
                raise InvalidRequest(f"{where}.extra.{ORCHARD_EXTRA_KEY} must be an object")
            unknown = sorted(set(orchard) - cls.ORCHARD_FIELDS)
            if unknown:
                raise InvalidRequest(
                    f"{where}.extra.{ORCHARD_EXTRA_KEY} has unknown field {unknown[0]!r}; it was written by a "
                    "different Orchard version — upgrade Orchard to read it")
            clashing = sorted(set(orchard) & set(data))
            if clashing:
                raise InvalidRequest(f"{where}: {clashing[0]!r} is set both directly and in "
                                     f"extra.{ORCHARD_EXTRA_KEY}; keep one")
            fields.update(orchard)
    if cls is Trajectory and "session_id" not in fields:
        fields["session_id"] = None  # optional since ATIF v1.7: keep it absent rather than invent one
    for name, value in fields.items():
        field = cls.model_fields.get(name)
        if field is None or name in cls.ORCHARD_FIELDS:
            continue  # unknown names are reported by validation; Orchard values validate as they are
        nested = _atif_model_in(field.annotation)
        if nested is not None:
            fields[name] = _import_value(nested, value, f"{where}.{name}")
    return fields


def _import_value(cls: type[AtifObject], value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        return _import(cls, value, where)
    if isinstance(value, list):
        return [_import_value(cls, item, f"{where}[{index}]") for index, item in enumerate(value)]
    return value  # e.g. a plain-string message where content parts are also allowed


def _atif_model_in(annotation: Any) -> type[AtifObject] | None:
    """The ATIF model class inside an annotation such as `list[Step]` or `str | list[ContentPart]`."""
    if isinstance(annotation, type) and issubclass(annotation, AtifObject):
        return annotation
    for argument in get_args(annotation):
        found = _atif_model_in(argument)
        if found is not None:
            return found
    return None


def _describe(error: ValidationError, limit: int = 5) -> str:
    problems = []
    for item in error.errors()[:limit]:
        location = ".".join(str(part) for part in item["loc"]) or "document"
        problems.append(f"{location}: {item['msg']}")
    more = error.error_count() - limit
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
