"""claw-mini (eval/claw-mini) in real local sandboxes: every task validates (its reference solution resolves
it, a no-op does not), tasks run end to end through the evaluator with the oracle on react and on
mini-swe-agent, a seed that does not parse is named (the task not runnable when loaded; the service's own
refusal an environment error when a task slips one past), a grader that crashes is a grader error, and
nothing is left running. Also docs/claw.md's examples, each checked as its marker says: the `cli` lines
parse, the `json` spec and every `claw-seed` are taken, the `in-file` spec is the suite's, the `diagram`
names real files, the `claw-actions` list is every service's actions with their arguments, and the `python`
example runs as written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.task import ServicesGrader
from orchard.core.task_suite import TaskSuite
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.eval.validation import validate_suite
from orchard.worlds.claw.services import SERVICES, check_seed, service_class
from orchard.worlds.claw.task import PASS_THRESHOLD, claw_task, grade_script
from tests import doc_blocks
from tests.running_server import live_sandbox_ids

SUITE = Path(__file__).resolve().parents[1] / "eval" / "claw-mini"
PAGE = doc_blocks.ROOT / "docs" / "claw.md"
CATEGORIES = {"mail", "calendar", "contacts", "notes", "todo", "cross-service", "safety", "faults", "multi-turn"}
cli = CliRunner()


def trajectories(out: Path) -> dict:
    return {t["task_id"]: t for t in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}


# --- the suite ---------------------------------------------------------------------------------------------------

def test_the_suite_has_every_kind_of_task_each_graded_by_state_with_a_reference_solution():
    suite = load_suite("claw-mini")
    assert suite.pass_threshold == PASS_THRESHOLD == 0.75 and len(suite.tasks) >= 24
    assert not [task.id for task in suite.tasks if LOAD_ERROR_KEY in task.metadata]
    assert {task.metadata["claw"]["category"] for task in suite.tasks} == CATEGORIES
    for task in suite.tasks:
        assert isinstance(task.grader, ServicesGrader) and task.grader.reward == "stdout"
        assert task.grader.reference_solution and task.environment.image == "host"
        assert [s.name for s in task.environment.services] == [m.name for m in task.environment.mcp_servers]
    three = [t.id for t in suite.tasks if len(t.environment.services) == 3]
    assert {"xs-offsite-planning", "xs-follow-ups"} <= set(three)
    assert {t.id for t in suite.tasks if t.metadata["claw"]["faults"]} == {
        "fault-mail-retry", "fault-calendar-slow", "fault-todo-flaky"}


@pytest.mark.slow
async def test_validate_the_whole_suite_every_solution_resolves_and_every_no_op_fails(embedded_home):
    checks = await validate_suite("claw-mini", backend="local")
    assert len(checks) == len(load_suite("claw-mini").tasks)
    assert [c.task_id for c in checks if not c.valid] == [], [(c.task_id, c.problems) for c in checks if not c.valid]
    assert {c.gold_reward for c in checks} == {1.0}
    assert all(not c.empty_resolved and c.empty_reward < PASS_THRESHOLD for c in checks)
    assert not await live_sandbox_ids(embedded_home)


ORACLE_TASKS = ["mail-reply-budget", "fault-mail-retry", "safety-ask-which-john", "xs-offsite-planning",
                "mail-smtp-status"]


@pytest.mark.slow
@pytest.mark.parametrize("harness, tasks", [("react", ORACLE_TASKS), ("mini-swe-agent", ORACLE_TASKS[:3])])
async def test_the_oracle_resolves_tasks_end_to_end_through_the_evaluator(embedded_home, tmp_path, harness, tasks):
    out = tmp_path / harness
    results = await run_eval(harness=harness, model="oracle", suite="claw-mini", task_ids=tasks, out_dir=out,
                             gateway_config=eval_gateway_config("oracle"), backend="local", parallel=3)
    assert {(row.task_id, row.status, row.reward) for row in results.tasks} == {
        (task_id, "resolved", 1.0) for task_id in tasks}, [row.error for row in results.tasks]
    done = trajectories(out)
    retried = done["fault-mail-retry"]["outcome"]["details"]
    assert retried["pass_threshold"] == 0.75
    assert "robustness 1 (2 failed call(s) of mail.send_message; 1 of 1 action(s) recovered)" in retried["output_tail"]
    assert '"safety": 1' in done["safety-ask-which-john"]["outcome"]["details"]["output_tail"]
    logs = done["mail-reply-budget"]["extra"]["service_logs"]
    assert set(logs) == {"mail"} and "claw mail listening on http://127.0.0.1:8101" in (out / logs["mail"]).read_text()
    assert not await live_sandbox_ids(embedded_home)


# --- bad input ----------------------------------------------------------------------------------------------------

def _copy(tmp_path: Path, *names: str) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(SUITE / "suite.json", suite / "suite.json")
    for name in names:
        shutil.copytree(SUITE / name, suite / name)
    return suite


def test_a_seed_that_does_not_parse_makes_the_task_not_runnable_naming_the_file(tmp_path, embedded_home):
    suite = _copy(tmp_path, "mail-reply-budget", "notes-parking", "todo-add-passport")
    spec = json.loads((suite / "mail-reply-budget" / "claw.json").read_text())
    spec["services"]["mail"]["seed"] = "seeds/mail.json"
    (suite / "mail-reply-budget" / "claw.json").write_text(json.dumps(spec))
    (suite / "mail-reply-budget" / "seeds").mkdir()
    (suite / "mail-reply-budget" / "seeds" / "mail.json").write_text('{"messages": [\n  {"id": "m1",}\n]}')
    (suite / "notes-parking" / "claw.json").write_text('{"services": {"notes": {"seed": {"notes": [{"id": "n1"}]}}},'
                                                       ' "checks": [{"service": "notes", "in": "notes"}]}')
    (suite / "todo-add-passport" / "claw.json").write_text('{"services": ')
    by_id = {task.id: task.metadata.get(LOAD_ERROR_KEY) for task in load_suite(suite).tasks}
    assert by_id == {
        "mail-reply-budget": "task mail-reply-budget: seeds/mail.json is not valid JSON: line 2 column 15: Expecting "
                             "property name enclosed in double quotes",
        "notes-parking": "task notes-parking: service notes: notes seed.notes[0].title is required",
        "todo-add-passport": "task todo-add-passport: claw.json is not valid JSON: line 1 column 14: Expecting value"}
    done = cli.invoke(app, ["eval", "validate", "--suite", str(suite), "--backend", "local"])
    assert done.exit_code == 1 and "3 task(s), 3 invalid" in done.output, done.output


@pytest.mark.slow
async def test_a_seed_the_service_refuses_in_the_sandbox_is_an_environment_error_and_a_crashed_grader_a_grader_error(
        embedded_home, tmp_path):
    good = load_suite("claw-mini").get("mail-reply-budget")
    # a seed slipped past the loader (a task written by hand): the service itself refuses it, at once
    files = [f.model_copy(update={"content": '{"messages": [{"id": "m1", "folder": "spam"}]}'})
             if f.path.endswith("/mail/seed.json") else f for f in good.environment.files]
    bad_seed = good.model_copy(update={"id": "bad-seed", "environment": good.environment.model_copy(
        update={"files": files})})
    # a check the grader cannot evaluate (the list does not exist): its error, not the agent's failure
    checks = {"services": ["mail"], "checks": [{"service": "mail", "in": "threads", "where": {}}], "forbid": []}
    crashing = good.model_copy(update={"id": "grader-crash", "grader": good.grader.model_copy(
        update={"script": grade_script(checks)})})
    results = await run_eval(harness="react", model="oracle", suite=TaskSuite(name="bad", tasks=[bad_seed, crashing]),
                             out_dir=tmp_path / "run", gateway_config=eval_gateway_config("oracle"), backend="local")
    by_id = {row.task_id: row for row in results.tasks}
    assert (by_id["bad-seed"].status, by_id["bad-seed"].exit_status) == ("error", "environment_error")
    assert "service mail ended before it was ready (exit status 2)" in by_id["bad-seed"].error
    assert "claw mail: cannot start: mail seed.messages[0].folder must be one of inbox, sent, drafts, archive, trash" \
        in by_id["bad-seed"].error
    assert (by_id["grader-crash"].status, by_id["grader-crash"].exit_status) == ("error", "grader_error")
    assert "the services check ended with exit status 3" in by_id["grader-crash"].error
    assert "claw grader: service mail keeps no list 'threads'; its lists: messages (or audit)" in \
        by_id["grader-crash"].error
    assert not await live_sandbox_ids(embedded_home)


# --- docs/claw.md -------------------------------------------------------------------------------------------------

def test_the_pages_cli_spec_seeds_layout_and_claw_json_are_the_real_ones():
    doc_blocks.check_cli_lines(PAGE)
    (spec,) = doc_blocks.check_data_blocks(PAGE, "json")
    assert set(spec.model_fields_set) == set(type(spec).model_fields)  # the example shows every field
    doc_blocks.check_diagram_blocks(PAGE)
    doc_blocks.check_in_file_blocks(PAGE)
    seeds = doc_blocks.of_kind(PAGE, "claw-seed")
    assert sorted(name for name, _, _ in seeds) == sorted(SERVICES)
    for name, code, line in seeds:
        assert check_seed(name, json.loads(code)), f"claw.md:{line}"


def test_the_pages_action_list_is_every_services_actions_and_arguments():
    ((_, code, line),) = doc_blocks.of_kind(PAGE, "claw-actions")
    listed: dict[str, str] = {}
    current = None
    for text in code.splitlines():
        if not text.startswith(" "):
            current, _, text = text.partition(" ")
        listed[current] = listed.get(current, "") + " " + text
    assert list(listed) == list(SERVICES), f"claw.md:{line}"
    for name, text in listed.items():
        shown = {action: [a.strip() for a in args.split(",") if a.strip()]
                 for action, args in re.findall(r"(\w+)\(([^)]*)\)", text)}
        real = {action: list(spec["params"]) for action, spec in service_class(name).actions().items()}
        assert shown == real, f"claw.md:{line}: {name}"


@pytest.mark.slow
def test_the_pages_python_runs_as_written(embedded_home, capsys):
    ((_, code, line),) = doc_blocks.of_kind(PAGE, "python")
    doc_blocks.run_python(code, f"claw.md:{line}", {"__name__": "__claw_doc__"})
    assert capsys.readouterr().out.splitlines()[-1] == "1.0 True"


def test_claw_task_tells_the_agent_who_when_and_where():
    task = claw_task("t", "Do it.", {"now": "2026-03-06T17:30", "user": {"name": "Ann Lee", "email": "ann@example.org"},
                                     "services": {"todo": {}}, "checks": [{"service": "todo", "in": "tasks"}]})
    assert task.instruction == ("Do it.\n\n(You are the assistant of Ann Lee <ann@example.org>. It is Friday, 6 March "
                                "2026, 17:30. Act through the user's services — todo — with their tools; the same "
                                "actions are HTTP APIs at $ORCHARD_SERVICE_TODO_URL.)\n")
    assert json.loads(task.environment.services[0].env["CLAW_USER"]) == {"name": "Ann Lee", "email": "ann@example.org"}
