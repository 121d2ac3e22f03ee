"""Orchard trajectories <-> plain ATIF JSON documents.

`to_atif` writes a document of exactly one ATIF version, the trajectory's declared `schema_version`
(Orchard's own trajectories declare ATIF-v1.6): every object gets only the fields that version gives it
(`FIELDS_ADDED_IN` below, from ATIF's RFC 0001). Everything else is Orchard data and goes under the
`extra["orchard"]` of the nearest object that has an `extra` at that version:

- each model's Orchard-only fields (`ORCHARD_FIELDS`) that differ from their defaults, by name;
- ATIF fields newer than the declared version (e.g. v1.7's `llm_call_count`, `trajectory_id`,
  `subagent_trajectories`), and agent-only step fields set on a system or user step, by name;
- the Orchard data of objects that have no `extra` at that version (at v1.6: tool calls, observation
  results), in the enclosing object's `extra["orchard"]["nested"]`, keyed by their path from it, e.g.
  `{"tool_calls[0]": {"raw_arguments": "...", "extra": {...}}, "observation.results[1]": {"extra": {...}}}`.

ATIF requires at least one step, and a rollout can have none (its environment failed before the agent
acted). Such a trajectory is written with one `system` step that says so and why (the exit status and the
error), and `extra["orchard"]["stand_in_step"]: true` on the trajectory marks that step as not part of the
interaction; `from_atif` drops it again, so the round trip still gives `steps == []`.

Embedded subagent trajectories (v1.7) are written by the document's version, which they then declare.
`from_atif` reverses this, so `from_atif(to_atif(t)) == t`, and reads plain ATIF (v1.0-v1.7) written by
other tools, where absent fields and nulls take Orchard's defaults."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from orchard.core.errors import InvalidRequest, describe_validation_errors
from orchard.core.trajectory import (
    ORCHARD_EXTRA_KEY,
    SUPPORTED_ATIF_VERSIONS,
    Agent,
    AtifObject,
    Content,
    ContentPart,
    ExtensibleAtifObject,
    FinalMetrics,
    ImageSource,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    SubagentTrajectoryRef,
    ToolCall,
    Trajectory,
)

NESTED_KEY = "nested"
STAND_IN_KEY = "stand_in_step"  # under a trajectory's extra["orchard"]: its one step stands in for none

# ATIF's fields per object and the minor version that added each (ATIF-v1.<n>), from RFC 0001's history:
# v1.1 root `extra`; v1.3 `completion_token_ids`; v1.4 `prompt_token_ids`; v1.5 `tool_definitions`,
# `is_copied_context`, `continued_trajectory_ref`; v1.6 content parts; v1.7 `extra` on tool calls and
# observation results, `llm_call_count`, `trajectory_id`, `subagent_trajectories`.
FIELDS_ADDED_IN: dict[type[AtifObject], dict[str, int]] = {
    Trajectory: {"schema_version": 0, "session_id": 0, "agent": 0, "steps": 0, "notes": 0, "final_metrics": 0,
                 "extra": 1, "continued_trajectory_ref": 5, "trajectory_id": 7, "subagent_trajectories": 7},
    Agent: {"name": 0, "version": 0, "model_name": 0, "extra": 0, "tool_definitions": 5},
    Step: {"step_id": 0, "timestamp": 0, "source": 0, "model_name": 0, "reasoning_effort": 0, "message": 0,
           "reasoning_content": 0, "tool_calls": 0, "observation": 0, "metrics": 0, "extra": 0,
           "is_copied_context": 5, "llm_call_count": 7},
    ToolCall: {"tool_call_id": 0, "function_name": 0, "arguments": 0, "extra": 7},
    Observation: {"results": 0},
    ObservationResult: {"source_call_id": 0, "content": 0, "subagent_trajectory_ref": 0, "extra": 7},
    SubagentTrajectoryRef: {"session_id": 0, "trajectory_path": 0, "extra": 0, "trajectory_id": 7},
    Metrics: {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "cost_usd": 0, "logprobs": 0,
              "extra": 0, "completion_token_ids": 3, "prompt_token_ids": 4},
    FinalMetrics: {"total_prompt_tokens": 0, "total_completion_tokens": 0, "total_cached_tokens": 0,
                   "total_cost_usd": 0, "total_steps": 0, "extra": 0},
    ContentPart: {"type": 6, "text": 6, "source": 6},
    ImageSource: {"media_type": 6, "path": 6},
}
# ATIF: "only applicable when source is agent".
AGENT_ONLY_STEP_FIELDS = frozenset({"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"})
# Required by ATIF but defaulted in Orchard's models: always written, even when equal to the default.
_ALWAYS_WRITTEN = frozenset({"schema_version", "session_id", "steps", "message", "arguments", "results"})
_PATH_SEGMENT = re.compile(r"^([a-z_]+)(?:\[(\d+)\])?$")


def to_atif(trajectory: Trajectory, *, version: str | None = None) -> dict[str, Any]:
    """The trajectory as a plain ATIF document (a JSON-ready dict) of `version`, by default its declared
    `schema_version`; at the declared version `from_atif` gives the same trajectory back."""
    version = version or trajectory.schema_version
    if version not in SUPPORTED_ATIF_VERSIONS:
        raise InvalidRequest(f"cannot write ATIF version {version!r}; Orchard writes "
                             f"{SUPPORTED_ATIF_VERSIONS[0]} to {SUPPORTED_ATIF_VERSIONS[-1]}")
    minor = int(version.rsplit(".", 1)[1])
    document, carried = _export(trajectory, minor, "trajectory")
    if carried:  # only ATIF-v1.0's root has no `extra`
        raise InvalidRequest(f"cannot write {version}: its root object has no `extra` to carry Orchard's data "
                             f"({', '.join(sorted(carried))}); write ATIF-v1.1 or later")
    return document


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
        problems = describe_validation_errors(exc, "document", limit=5)
        raise InvalidRequest(f"not a valid ATIF trajectory: {problems}") from None


# --- export ----------------------------------------------------------------------------------------

def _allowed(model: AtifObject, minor: int) -> set[str]:
    added = FIELDS_ADDED_IN.get(type(model))
    if added is None:  # a model this table does not know: a schema bug, caught by the tests
        raise TypeError(f"{type(model).__name__} is not in orchard.core.atif.FIELDS_ADDED_IN")
    allowed = {name for name, since in added.items() if since <= minor}
    if isinstance(model, Step) and model.source != "agent":
        allowed -= AGENT_ONLY_STEP_FIELDS
    if minor < 6:  # content parts (a list) came with v1.6; before it, message and content are text
        allowed -= {name for name in ("message", "content") if isinstance(getattr(model, name, None), list)}
    return allowed


def _export(model: AtifObject, minor: int, where: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the ATIF object, the Orchard data it could not hold itself, keyed by path relative to it: "" for
    its own, e.g. "results[0]" for a child's). An object with an `extra` holds all of it there."""
    cls = type(model)
    allowed = _allowed(model, minor)
    out: dict[str, Any] = {}
    own: dict[str, Any] = {}  # Orchard fields and ATIF fields this version does not have
    carried: dict[str, dict[str, Any]] = {}
    for name, field in cls.model_fields.items():
        if name == "extra":
            continue
        value = getattr(model, name)
        default = field.get_default(call_default_factory=True)
        if name in cls.ORCHARD_FIELDS or name not in allowed:
            if value != default and not (value is None and name not in cls.ORCHARD_FIELDS):
                own[name] = _plain(value)
            continue
        if value is None:
            if name == "session_id" and minor < 7:
                raise InvalidRequest(f"cannot write ATIF-v1.{minor}: {where}.session_id is required before "
                                     "ATIF-v1.7; set one, or export as ATIF-v1.7")
            continue
        if name not in _ALWAYS_WRITTEN and not field.is_required() and value == default:
            continue  # an optional ATIF field at its default: absent in ATIF means the same
        out[name] = _export_value(value, minor, name, f"{where}.{name}", carried)
    if isinstance(model, Trajectory):  # embedded subagents are part of the document: written by its version
        out["schema_version"] = f"ATIF-v1.{minor}"
        if not out["steps"]:  # ATIF needs at least one step: say why there are none, marked as a stand-in
            out["steps"] = [{"step_id": 1, "source": "system", "message": _no_steps_text(model)}]
            own[STAND_IN_KEY] = True
    if "message" in own:  # content parts before v1.6: the required message keeps their text
        out["message"] = _text_of(model.message)
    if isinstance(model, SubagentTrajectoryRef) and minor >= 7 and not (model.trajectory_id or model.trajectory_path):
        raise InvalidRequest(f"cannot write ATIF-v1.7: {where} has only a session_id; ATIF-v1.7 resolves "
                             "subagent references by trajectory_id or trajectory_path")
    user_extra = copy.deepcopy(model.extra) if isinstance(model, ExtensibleAtifObject) else {}
    if "extra" in allowed:
        orchard = own
        if carried:
            orchard[NESTED_KEY] = carried
        if orchard:
            user_extra[ORCHARD_EXTRA_KEY] = orchard
        if user_extra:
            out["extra"] = user_extra
        return out, {}
    if user_extra:
        own["extra"] = user_extra
    if own:
        carried[""] = own
    return out, carried


def _export_value(value: Any, minor: int, key: str, where: str, carried: dict[str, dict[str, Any]]) -> Any:
    """An ATIF field's value; the Orchard data of objects in it that have no `extra` lands in `carried`."""
    if isinstance(value, AtifObject):
        out, inner = _export(value, minor, where)
        for path, record in inner.items():
            carried[f"{key}.{path}" if path else key] = record
        return out
    if isinstance(value, list):
        return [_export_value(item, minor, f"{key}[{index}]", f"{where}[{index}]", carried)
                for index, item in enumerate(value)]
    return copy.deepcopy(value)


def _plain(value: Any) -> Any:
    """Orchard data as JSON-ready values; validated back by its own model on import, where left-out
    defaults come back."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return copy.deepcopy(value)


def _no_steps_text(trajectory: Trajectory) -> str:
    why = []
    if trajectory.exit_status is not None:
        why.append(f"exit status {trajectory.exit_status}")
    if trajectory.outcome is not None and trajectory.outcome.error:
        why.append(f"error: {trajectory.outcome.error}")
    return ("[orchard] This rollout recorded no steps" + (f" ({'; '.join(why)})" if why else "")
            + ". ATIF requires at least one step, so this system step stands in for none; it is not part of "
              "the interaction.")


def _text_of(content: Content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.text or "" for part in content)


# --- import ----------------------------------------------------------------------------------------

def _import(cls: type[AtifObject], data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """ATIF object -> the field values of `cls`, Orchard data lifted out of `extra`."""
    fields = {key: value for key, value in data.items() if value is not None}  # null = absent in ATIF
    from_orchard: set[str] = set()
    if issubclass(cls, ExtensibleAtifObject) and isinstance(fields.get("extra"), Mapping):
        extra = dict(fields["extra"])
        orchard = extra.pop(ORCHARD_EXTRA_KEY, None)
        fields["extra"] = extra
        if orchard is not None:
            if not isinstance(orchard, Mapping):
                raise InvalidRequest(f"{where}.extra.{ORCHARD_EXTRA_KEY} must be an object")
            orchard = dict(orchard)
            nested = orchard.pop(NESTED_KEY, None)
            stand_in = cls is Trajectory and orchard.pop(STAND_IN_KEY, False) is True
            unknown = sorted(set(orchard) - set(cls.model_fields) - {"extra"})
            if unknown:
                raise InvalidRequest(
                    f"{where}.extra.{ORCHARD_EXTRA_KEY} has unknown field {unknown[0]!r}; it was written by a "
                    "different Orchard version — upgrade Orchard to read it")
            clashing = sorted((set(orchard) & set(fields)) - {"message"})  # message: the parts' text fallback
            if clashing:
                raise InvalidRequest(f"{where}: {clashing[0]!r} is set both directly and in "
                                     f"extra.{ORCHARD_EXTRA_KEY}; keep one")
            fields.update(orchard)
            from_orchard = set(orchard)
            if stand_in:  # the one step only said that the rollout had none
                fields["steps"] = []
            if nested is not None:
                _restore_nested(fields, nested, f"{where}.extra.{ORCHARD_EXTRA_KEY}.{NESTED_KEY}")
    if cls is Trajectory and "session_id" not in fields:
        fields["session_id"] = None  # optional since ATIF v1.7: keep it absent rather than invent one
    for name, value in fields.items():
        field = cls.model_fields.get(name)
        if field is None or name in cls.ORCHARD_FIELDS or name in from_orchard:
            continue  # unknown names are reported by validation; Orchard values validate as they are
        nested_cls = _atif_model_in(field.annotation)
        if nested_cls is not None:
            fields[name] = _import_value(nested_cls, value, f"{where}.{name}")
    return fields


def _restore_nested(fields: dict[str, Any], nested: Any, where: str) -> None:
    """Put each carried record back as the `extra` (Orchard data under `extra["orchard"]`) of the object
    at its path, so that object imports as if it had had an `extra` of its own."""
    if not isinstance(nested, Mapping):
        raise InvalidRequest(f"{where} must be an object")
    for path, record in nested.items():
        target = _resolve(fields, str(path))
        if not isinstance(target, dict) or not isinstance(record, Mapping):
            raise InvalidRequest(f"{where}: {path!r} does not name an object of this document")
        record = dict(record)
        extra = record.pop("extra", None) or {}
        if not isinstance(extra, Mapping):
            raise InvalidRequest(f"{where}.{path}.extra must be an object")
        extra = dict(extra)
        if record:
            extra[ORCHARD_EXTRA_KEY] = record
        if target.get("extra"):
            raise InvalidRequest(f"{where}: the object at {path!r} has an `extra` of its own too; keep one")
        target["extra"] = extra


def _resolve(fields: dict[str, Any], path: str) -> Any:
    node: Any = fields
    for segment in path.split("."):
        match = _PATH_SEGMENT.match(segment)
        if match is None or not isinstance(node, Mapping):
            return None
        node = node.get(match.group(1))
        if match.group(2) is not None:
            index = int(match.group(2))
            node = node[index] if isinstance(node, list) and index < len(node) else None
    return node


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
