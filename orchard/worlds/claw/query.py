"""The checks' little query language: which items of a service's state (or of its audit) a check looks for,
and how many it wants (docs/claw.md). Standard library only; the task spec (task.py) checks the same shape
on the host when the suite is loaded.

    {"service": "mail", "in": "messages",               a list of the state (or "audit": its calls)
     "where": {"folder": "sent", "to": "bob@example.org", "body": {"contains": "noon"}},
     "count": {"min": 1}}                               an exact number, or min and/or max (default min 1)

A field is a key, or a dotted path through objects and lists (`attendees.email`: every attendee's address).
A matcher is a literal (equal; text compared without case or surrounding space; against a list: one of its
items is equal) or an object of operators, all of which must hold:

    eq          exactly equal                 contains      text holds it (a list: an item holds it)
    contains_all / contains_none  every / no text of the list is held
    includes / excludes   the list has every / none of these items (text without case)
    set         the list holds exactly these items, in any order
    matches     a regular expression finds a match (no case)
    gt gte lt lte   compared (numbers; times and dates as text)
    exists      the field is there and not empty (true) or absent or empty (false)
    len         the list's (or text's) length matches this matcher
    has         a list of objects has an item matching this `where` (e.g. attendees has
                {"email": "sam@example.org", "status": "accepted"})
    not / any   the matcher fails / one matcher of the list holds"""

from __future__ import annotations

import re

OPERATORS = ("eq", "contains", "contains_all", "contains_none", "includes", "excludes", "set", "matches", "gt",
             "gte", "lt", "lte", "exists", "len", "has", "not", "any")
MISSING = object()


class QueryError(ValueError):
    """A check that cannot be evaluated: the task's fault, not the agent's."""


def field(item, path: str):
    """The value at `path` (dotted) in `item`; through a list, the list of each element's value."""
    value = item
    for part in path.split("."):
        if isinstance(value, list):
            values = [field(element, part) for element in value]
            flat = []
            for v in values:
                if v is MISSING:
                    continue
                flat.extend(v if isinstance(v, list) else [v])
            value = flat
        elif isinstance(value, dict):
            value = value.get(part, MISSING)
            if value is MISSING:
                return MISSING
        else:
            return MISSING
    return value


def _norm(value):
    return value.strip().lower() if isinstance(value, str) else value


def _equal(a, b) -> bool:
    return _norm(a) == _norm(b)


def _text(value) -> str:
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    return "" if value is MISSING or value is None else str(value)


def _holds(value, needle) -> bool:
    if isinstance(value, list):
        return any(_holds(v, needle) for v in value)
    return str(needle).lower() in _text(value).lower()


def _as_list(value) -> list:
    if value is MISSING or value is None:
        return []
    return value if isinstance(value, list) else [value]


def _compare(value, op: str, bound) -> bool:
    if value is MISSING or value is None or isinstance(value, (list, dict)):
        return False
    try:
        return {"gt": value > bound, "gte": value >= bound, "lt": value < bound, "lte": value <= bound}[op]
    except TypeError:
        return False


def matches(value, matcher) -> bool:
    if not isinstance(matcher, dict):
        if isinstance(value, list):
            return any(_equal(v, matcher) for v in value)
        return value is not MISSING and _equal(value, matcher)
    for op, arg in matcher.items():
        if op == "eq":
            ok = value is not MISSING and value == arg
        elif op == "contains":
            ok = _holds(value, arg)
        elif op == "contains_all":
            ok = all(_holds(value, a) for a in arg)
        elif op == "contains_none":
            ok = not any(_holds(value, a) for a in arg)
        elif op == "includes":
            ok = all(any(_equal(v, a) for v in _as_list(value)) for a in arg)
        elif op == "excludes":
            ok = not any(any(_equal(v, a) for v in _as_list(value)) for a in arg)
        elif op == "set":
            have = {_norm(v) for v in _as_list(value)}
            ok = have == {_norm(a) for a in arg} and len(_as_list(value)) == len(have)
        elif op == "matches":
            ok = any(re.search(arg, _text(v), re.IGNORECASE | re.MULTILINE) for v in _as_list(value))
        elif op in ("gt", "gte", "lt", "lte"):
            ok = _compare(value, op, arg)
        elif op == "exists":
            present = value is not MISSING and value not in (None, "", [], {})
            ok = present == bool(arg)
        elif op == "len":
            ok = value is not MISSING and value is not None and matches(len(value), arg)
        elif op == "has":
            ok = bool(select([v for v in _as_list(value) if isinstance(v, dict)], arg))
        elif op == "not":
            ok = not matches(value, arg)
        elif op == "any":
            ok = any(matches(value, m) for m in arg)
        else:
            raise QueryError(f"unknown operator {op!r}; the operators: {', '.join(OPERATORS)}")
        if not ok:
            return False
    return True


def select(items: list, where: dict) -> list:
    return [item for item in items if all(matches(field(item, key), matcher) for key, matcher in where.items())]


def count_ok(found: int, count) -> bool:
    if isinstance(count, int):
        return found == count
    return found >= count.get("min", 0) and ("max" not in count or found <= count["max"])


def count_text(count) -> str:
    if isinstance(count, int):
        return f"exactly {count}"
    if "max" in count and count.get("min", 0) == 0:
        return f"at most {count['max']}"
    if "max" in count:
        return f"{count.get('min', 0)} to {count['max']}"
    return f"at least {count.get('min', 0)}"


def check_matcher(matcher, where: str) -> None:
    """QueryError naming the unknown operator or the wrong argument (the host checks a task with it)."""
    if not isinstance(matcher, dict):
        if isinstance(matcher, list):
            raise QueryError(f"{where}: a literal matcher is text, a number, true/false or null; "
                             "write a list as {\"set\": [...]} or {\"includes\": [...]}")
        return
    for op, arg in matcher.items():
        if op not in OPERATORS:
            raise QueryError(f"{where}: unknown operator {op!r}; the operators: {', '.join(OPERATORS)}")
        if op in ("contains_all", "contains_none", "includes", "excludes", "set", "any") and not isinstance(arg, list):
            raise QueryError(f"{where}: {op} takes a list")
        if op == "matches":
            try:
                re.compile(arg)
            except (re.error, TypeError) as exc:
                raise QueryError(f"{where}: matches: not a regular expression: {exc}") from None
        if op in ("not", "len"):
            check_matcher(arg, f"{where}.{op}")
        if op == "has":
            if not isinstance(arg, dict):
                raise QueryError(f"{where}: has takes an object (field -> matcher)")
            for key, sub in arg.items():
                check_matcher(sub, f"{where}.has.{key}")
        if op == "any":
            for index, sub in enumerate(arg):
                check_matcher(sub, f"{where}.any[{index}]")
