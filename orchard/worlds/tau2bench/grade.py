"""The tau2-bench grader, run after the agent stops (a `services` grader with `reward: "stdout"`), as
tau2-bench's evaluator scores a simulation (its reward basis, default DB and COMMUNICATE; binary):

- DB: the hash of the domain's database after the agent (the service's `/state`) against the hash of a fresh
  database after replaying the task's gold actions with tau2's own tools (a gold action that raises is
  skipped, as tau2 skips it);
- COMMUNICATE: each `communicate_info` string appears, without case and with the message's commas taken out,
  in one of the agent's messages to the customer (the user service's `messages` of role `agent`).

Reward = the product of the basis' parts: 1 or 0. It prints a line per part, a `tau2-reward` JSON line and
the reward last. A service that does not answer, or criteria it cannot read, ends it with exit status 3 and
the reason on stderr: the grader's error, never the agent's failure. Runs in the sandbox (tau2 imported)."""

from __future__ import annotations

import json
import os

from ..claw.base import STATE_FILE
from ..claw.grade import TIMEOUT_S, GradeError, fetch, run_grader, service_url
from ..claw.http_client import HttpError, request
from ..claw.http_server import ADMIN_HEADER, ADMIN_TOKEN_FILE
from .domain import fresh_environment

GRADED = ("DB", "COMMUNICATE")


def agent_hash(service: str, environ=None) -> str:
    """The hash of the database as the agent left it: from the state file the service writes after every change
    (in its state directory, which only the services' user reads), else from its `/state` (the whole database:
    seconds to serialize and parse)."""
    environ = os.environ if environ is None else environ
    directory = environ.get(f"ORCHARD_SERVICE_{service.upper().replace('-', '_')}_STATE")
    if directory and os.path.isfile(os.path.join(directory, STATE_FILE)):
        try:
            with open(os.path.join(directory, STATE_FILE), encoding="utf-8") as f:
                found = json.load(f).get("db_hash")
        except (OSError, ValueError) as exc:
            raise GradeError(f"the {service} service's state file cannot be read: {exc}") from None
    else:  # nothing changed it yet: ask the service, with the admin token its state directory holds
        found = _private_state(service, directory, environ).get("db_hash")
    if not isinstance(found, str):
        raise GradeError(f"the {service} service gave no database hash")
    return found


def _private_state(service: str, directory: str | None, environ) -> dict:
    url = service_url(service, environ).rstrip("/") + "/state"
    try:
        with open(os.path.join(directory or "", ADMIN_TOKEN_FILE), encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise GradeError(f"the {service} service's admin token cannot be read: {exc}") from None
    try:
        status, answer = request(url, headers={ADMIN_HEADER: token}, timeout=TIMEOUT_S)
    except HttpError as exc:
        raise GradeError(str(exc)) from None
    if status != 200 or not isinstance(answer, dict):
        raise GradeError(f"GET {url} answered {status}: {str(answer)[:200]}")
    return answer


def gold_hash(domain: str, actions: list) -> tuple:
    """(hash, notes): a fresh database's hash after the gold actions, each note a gold action that raised."""
    environment = fresh_environment(domain)
    notes = []
    for index, action in enumerate(actions):
        try:
            environment.make_tool_call(action["name"], requestor=action.get("requestor") or "assistant",
                                       **action.get("arguments", {}))
        except Exception as exc:  # noqa: BLE001 — tau2's evaluator logs and skips a gold action that fails
            notes.append(f"gold action {index} {action['name']} raised: {exc}")
    return environment.get_db_hash(), notes


def communicated(info: list, agent_texts: list) -> list:
    """(info, found) for each string, as tau2 checks it: in a message's text, lower case, commas removed."""
    said = [text.lower().replace(",", "") for text in agent_texts]
    return [(item, any(item.lower() in text for text in said)) for item in info]


def grade(criteria: dict, environ=None) -> tuple:
    """(reward, report lines)."""
    basis = criteria.get("reward_basis") or list(GRADED)
    unknown = [part for part in basis if part not in GRADED]
    if unknown:
        raise GradeError(f"reward basis {', '.join(unknown)} is not graded here (only {', '.join(GRADED)})")
    lines, parts = [], {}
    if "DB" in basis:
        agent = agent_hash(criteria["service"], environ)
        gold, notes = gold_hash(criteria["domain"], criteria.get("actions", []))
        parts["DB"] = 1.0 if agent == gold else 0.0
        lines += notes
        lines.append(f"{'PASS' if parts['DB'] else 'FAIL'}  DB: the database after the agent "
                     f"{'matches' if parts['DB'] else 'differs from'} the gold actions' "
                     f"({len(criteria.get('actions', []))} replayed; hash {agent[:12]} vs {gold[:12]})")
    if "COMMUNICATE" in basis:
        info = criteria.get("communicate_info", [])
        texts = []
        if info:
            user = fetch(service_url(criteria["user_service"], environ).rstrip("/") + "/state")
            texts = [m.get("text", "") for m in user.get("messages", []) if m.get("role") == "agent"]
        checks = communicated(info, texts)
        parts["COMMUNICATE"] = 1.0 if all(found for _, found in checks) else 0.0
        for item, found in checks:
            lines.append(f"{'PASS' if found else 'FAIL'}  COMMUNICATE: {item!r} told to the customer")
        if not info:
            lines.append("PASS  COMMUNICATE: nothing to tell")
    reward = 1.0
    for value in parts.values():
        reward *= value
    lines.append("tau2-reward " + json.dumps({"reward": reward, "breakdown": parts}))
    return reward, lines


def main(text: str, environ=None) -> int:
    def score(criteria: dict) -> tuple:
        if "domain" not in criteria:
            raise GradeError("the criteria must be a JSON object naming the domain")
        return grade(criteria, environ)

    return run_grader("tau2", "criteria", text, score)
