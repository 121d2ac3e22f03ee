"""What every Claw service shares: actions declared once (the HTTP API, http_server.py, and the MCP tools,
mcp_stdio.py, are both made from them), state loaded from a seed and kept in the state directory, the audit
of every action, reset, the world's clock and injected faults (faults.py). Standard library only (it runs
inside the sandbox)."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timedelta

from .faults import FaultPlan

SEED_FILE = "seed.json"  # in the state directory (the task's seed_dir copied there) or given by --seed
STATE_FILE = "state.json"  # the state after every change, written whole (a grader may read it too)
AUDIT_FILE = "audit.jsonl"  # one call a line, as /audit lists them
DEFAULT_NOW = "2026-03-02T09:00"
RESULT_AUDIT_CHARS = 2000


class SeedError(ValueError):
    """A seed that is not JSON, or not the shape the service keeps."""


class ActionError(Exception):
    """An action refused: its HTTP status and a message that says what to do instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def clone(data):
    """A deep copy of JSON data (the copy module's import would cost more than this)."""
    return json.loads(json.dumps(data))


def bad(message: str) -> ActionError:
    return ActionError(400, message)


def not_found(what: str) -> ActionError:
    return ActionError(404, what)


# --- the actions' argument schemas (JSON Schema, as MCP tools declare them) --------------------------------

def string(description: str) -> dict:
    return {"type": "string", "description": description}


def integer(description: str) -> dict:
    return {"type": "integer", "description": description}


def boolean(description: str) -> dict:
    return {"type": "boolean", "description": description}


def strings(description: str) -> dict:
    return {"type": "array", "items": {"type": "string"}, "description": description}


def objects(description: str, properties: dict) -> dict:
    return {"type": "array", "description": description,
            "items": {"type": "object", "properties": properties}}


_JSON_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


def action(description: str, params: dict | None = None, required: tuple = (), mutates: bool = True):
    """Declare a method of a Service an action: `POST /<name>` and the MCP tool `<name>`."""
    def wrap(method):
        method.claw_action = {"description": description, "params": params or {}, "required": tuple(required),
                              "mutates": mutates}
        return method
    return wrap


def check_arguments(name: str, spec: dict, arguments) -> dict:
    """The arguments as the action takes them, or an ActionError (400) saying what is wrong."""
    if not isinstance(arguments, dict):
        raise bad(f"{name} takes a JSON object of arguments")
    params = spec["params"]
    unknown = sorted(set(arguments) - set(params))
    if unknown:
        raise bad(f"{name} has no argument {', '.join(unknown)}; it takes: {', '.join(params) or 'none'}")
    missing = [key for key in spec["required"] if arguments.get(key) in (None, "")]
    if missing:
        raise bad(f"{name} needs {', '.join(missing)}")
    for key, value in arguments.items():
        if value is None:
            continue
        wanted = _JSON_TYPES[params[key]["type"]]
        if wanted is list and isinstance(value, str) and params[key].get("items", {}).get("type") == "string":
            arguments[key] = value = [value]  # one recipient for a list of them
        if wanted is int and isinstance(value, float) and value.is_integer():
            arguments[key] = value = int(value)
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise bad(f"{name}: {key} must be a{'n' if params[key]['type'][0] in 'aio' else ''} "
                      f"{params[key]['type']}, got {json.dumps(value)[:60]}")
        if wanted is list and params[key].get("items", {}).get("type") == "string" and not all(
                isinstance(item, str) for item in value):
            raise bad(f"{name}: {key} must be a list of strings")
    return arguments


# --- seeds -------------------------------------------------------------------------------------------------

def load_seed(path: str) -> dict:
    """The seed file's object ({} when there is none); SeedError naming the file and where it breaks."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise SeedError(f"{path} is not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SeedError(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise SeedError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


class Fields:
    """Reading one object of a seed with its path for errors: `f.text("subject")`, `f.texts("to")`."""

    def __init__(self, data, where: str, known: tuple) -> None:
        if not isinstance(data, dict):
            raise SeedError(f"{where} must be an object, not {json.dumps(data)[:60]}")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise SeedError(f"{where} has unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")
        self.data, self.where = data, where

    def get(self, key: str, kind: type, default):
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise SeedError(f"{self.where}.{key} must be a {kind.__name__}, not {json.dumps(value)[:60]}")
        return value

    def text(self, key: str, default: str | None = "") -> str | None:
        return self.get(key, str, default)

    def required(self, key: str) -> str:
        value = self.text(key, None)
        if not value:
            raise SeedError(f"{self.where}.{key} is required")
        return value

    def texts(self, key: str, default=()) -> list:
        value = self.data.get(key, list(default))
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise SeedError(f"{self.where}.{key} must be a list of strings")
        return list(value)

    def flag(self, key: str, default: bool = False) -> bool:
        return self.get(key, bool, default)

    def items(self, key: str) -> list:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise SeedError(f"{self.where}.{key} must be a list")
        return value


def parse_time(text: str, what: str) -> datetime:
    """A time of the world, `YYYY-MM-DDTHH:MM` (seconds allowed; no time zone: the world has one)."""
    try:
        value = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise bad(f"{what} must be a time like 2026-03-04T14:00, not {json.dumps(text)[:40]}") from None
    if value.tzinfo is not None:
        value = value.replace(tzinfo=None)
    return value


def time_text(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M") if value.second == 0 else value.strftime("%Y-%m-%dT%H:%M:%S")


def seed_time(text, where: str) -> str:
    try:
        return time_text(parse_time(text, where))
    except ActionError as exc:
        raise SeedError(str(exc)) from None


def unique_ids(items: list, where: str) -> None:
    seen = set()
    for item in items:
        if item["id"] in seen:
            raise SeedError(f"{where}: id {item['id']!r} is used twice")
        seen.add(item["id"])


# --- the service -----------------------------------------------------------------------------------------

class Service:
    """One service's state and actions. A subclass names itself, turns a seed into its state
    (`state_from_seed`, raising SeedError) and declares its actions with @action."""

    name = "service"
    description = ""
    # GET /state needs the admin token: the agent may see only what the tools show (tau2's database holds
    # every customer), not the whole store. The Claw services' state is the user's own data: open.
    private_state = False

    def __init__(self, seed: dict, *, now: str = DEFAULT_NOW, user: dict | None = None,
                 faults: FaultPlan | None = None, state_dir: str | None = None) -> None:
        self.user = {"name": "Sam Rivera", "email": "sam@example.org", **(user or {})}
        self.started_at = parse_time(now, "CLAW_NOW")
        self.faults = faults or FaultPlan({})
        self.state_dir = state_dir
        self.lock = threading.RLock()
        self.seed = seed
        self.state = self.state_from_seed(clone(seed))
        self.calls: list = []
        self.counter = 0

    # subclasses
    def state_from_seed(self, seed: dict) -> dict:
        raise NotImplementedError

    @classmethod
    def actions(cls) -> dict:
        found = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if callable(member) and hasattr(member, "claw_action"):
                    found[name] = member.claw_action
        return found

    @classmethod
    def tools(cls) -> list:
        return [{"name": name, "description": spec["description"],
                 "inputSchema": {"type": "object", "properties": spec["params"],
                                 "required": list(spec["required"])}}
                for name, spec in cls.actions().items()]

    # the world's clock: it starts at CLAW_NOW and moves a minute with each change, so that what the agent
    # does is dated after the seed and in order, the same on every run
    def now(self) -> str:
        return time_text(self.started_at + timedelta(minutes=self.counter))

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{100 + self.counter}"

    def call(self, name: str, arguments, via: str = "http"):
        """Run one action as a client asked: (status, answer). Faults first, then the action under the
        state's lock; every call is audited."""
        spec = self.actions().get(name)
        if spec is None:
            return 404, {"error": f"{self.name} has no action {name!r}; its actions: "
                                  f"{', '.join(self.actions())} (GET /tools describes them)"}
        fault = self.faults.draw(name)
        if fault == "slow":
            time.sleep(self.faults.slow_s)
        elif fault is not None:
            status = int(fault)
            answer = {"error": FAULT_MESSAGES.get(status, "the service failed; try again")}
            self._audit(name, arguments, status, answer, via, fault)
            return status, answer
        with self.lock:
            try:
                result = getattr(self, name)(**check_arguments(name, spec, dict(arguments)
                                                               if isinstance(arguments, dict) else arguments))
                status, answer = 200, result
            except ActionError as exc:
                status, answer = exc.status, {"error": str(exc)}
            except Exception as exc:  # noqa: BLE001 — a bug of the service's: answered and audited, not a hang-up
                status, answer = 500, {"error": f"the {self.name} service failed: {type(exc).__name__}: {exc}"}
            if status == 200 and spec["mutates"]:
                self.save()
            self._audit(name, arguments, status, answer, via, fault)
        return status, answer

    def _audit(self, name, arguments, status, answer, via, fault) -> None:
        with self.lock:
            text = json.dumps(answer)
            entry = {"seq": len(self.calls) + 1, "action": name, "arguments": arguments, "status": status,
                     "via": via, "fault": fault, "time": self.now(),
                     "result": answer if len(text) <= RESULT_AUDIT_CHARS else text[:RESULT_AUDIT_CHARS] + "..."}
            self.calls.append(entry)
            if self.state_dir:
                with open(os.path.join(self.state_dir, AUDIT_FILE), "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")

    def save(self) -> None:
        if not self.state_dir:
            return
        path = os.path.join(self.state_dir, STATE_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(self.state, f, indent=1)
        os.replace(path + ".tmp", path)

    def reset(self) -> None:
        with self.lock:
            self.state = self.state_from_seed(clone(self.seed))
            self.calls, self.counter = [], 0
            self.faults.reset()
            if self.state_dir:
                open(os.path.join(self.state_dir, AUDIT_FILE), "w").close()
            self.save()

    def describe(self) -> dict:
        return {"service": self.name, "description": self.description, "user": self.user,
                "now": time_text(self.started_at),
                "actions": {name: spec["description"] for name, spec in self.actions().items()},
                "endpoints": ["GET /health", "GET /tools", "GET /state", "GET /audit", "POST /reset",
                              "POST /<action> with a JSON object of arguments"]}


FAULT_MESSAGES = {
    429: "too many requests: the service is rate limiting you; wait a moment and retry (nothing was done)",
    500: "internal server error: the request was not carried out; retry",
    502: "bad gateway: the request was not carried out; retry",
    503: "service unavailable: the request was not carried out; retry shortly",
}
