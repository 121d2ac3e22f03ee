"""The `claw-bench` suite: the task directories of the installed PyPI package claw-bench 0.1.0, read where pip
put them (found from the distribution's own file list, nothing copied into the repository), grouped by
domain. Loading the whole suite (222 tasks, the two broken upstream listed as not runnable with the reason,
found from their files), how the defects are found, the suite's name when the package is missing, and a
handful of tasks across domains validated and run end to end in real sandboxes on the embedded local backend,
offline (the solution resolves each, a no-op does not; the no-ops that still earn partial credit said), and
docs/suites.md's claw-bench example. The whole suite's validation is too slow for the tests: its figures are
in docs/suites.md."""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.errors import NotFound
from orchard.eval.dialects import load_task_dir, load_task_dirs
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.eval.models import eval_gateway_config
from orchard.eval.packaged_suites import CLAW_BENCH, PACKAGED_SUITES
from orchard.eval.runner import run_eval
from orchard.eval.suites import available_suites, load_suite
from orchard.eval.validation import validate_suite
from tests import doc_blocks
from tests.running_server import live_sandbox_ids

ROOT = doc_blocks.ROOT
MINI_TASK = ROOT / "eval" / "task-dirs-mini" / "claw-sales-summary"
NOT_RUNNABLE = {
    "mem-010": "task mem-010 (mem-010-multi-file-context-correlation): its input data is missing: "
               "environment/setup.sh copies from environment/data, which the task does not have (the instruction "
               "names file_a.txt, file_b.txt, file_c.txt, file_d.txt, file_e.txt)",
    "sys-008": "task sys-008 (sys-008-log-rotation-script): solution/solve.sh has a syntax error (bash -n): line 113: "
               "syntax error near unexpected token `('",
}
# one or two tasks of several domains: plain JSON output, a verifier importing yaml, a solution running
# `python` with yaml, a verifier that reads <task>/workspace, no-ops earning 0.75 and 0.05 of the checks
HANDFUL = ["cal-001", "file-007", "mm-004", "xdom-013", "code-003", "wfl-010"]
PARTIAL_NOOPS = {"code-003": 0.75, "wfl-010": 0.05}
cli = CliRunner()


def installed_tasks_dir() -> Path:
    """Where the distribution's RECORD puts claw-bench's tasks (the wheel's data: <prefix>/share/...)."""
    distribution = importlib.metadata.distribution("claw-bench")
    conftest = next(file for file in distribution.files if file.as_posix().endswith("claw-bench/tasks/conftest.py"))
    return Path(distribution.locate_file(conftest)).resolve().parent


# --- loading ---------------------------------------------------------------------------------------

def test_the_whole_suite_loads_in_place_with_the_broken_tasks_named():
    tasks_dir = installed_tasks_dir()
    assert available_suites()["claw-bench"] == tasks_dir
    assert not (ROOT / "eval" / "claw-bench").exists()  # read where pip put it, nothing copied
    suite = load_suite("claw-bench")
    assert (suite.name, suite.pass_threshold, len(suite.tasks)) == ("claw-bench", 1.0, 222)
    assert suite.description.endswith(f"claw-bench 0.1.0, {tasks_dir}")
    assert len({task.id for task in suite.tasks}) == 222
    info = [task.metadata["claw_bench"] for task in suite.tasks]
    assert collections.Counter(item["domain"] for item in info) == {
        **{domain: 15 for domain in ("calendar", "code-assistance", "communication", "file-operations", "multimodal",
                                     "security", "web-browsing")},
        "document-editing": 18, "email": 18, "cross-domain": 17, "data-analysis": 17, "workflow-automation": 17,
        "memory": 15, "system-admin": 15}
    assert collections.Counter(item["level"] for item in info) == {"L1": 40, "L2": 81, "L3": 76, "L4": 25}
    assert {(task.environment.image, task.environment.workdir, task.metadata["dialect"]) for task in suite.tasks} \
        == {("host", "/workspace", "claw-bench")}
    broken = {task.id: task.metadata[LOAD_ERROR_KEY] for task in suite.tasks if LOAD_ERROR_KEY in task.metadata}
    assert broken.keys() == NOT_RUNNABLE.keys()
    for task_id, reason in NOT_RUNNABLE.items():
        assert broken[task_id].startswith(reason), broken[task_id]
    # the directory itself is the same suite, under the same name
    assert load_suite(tasks_dir).name == "claw-bench"


def test_without_the_package_the_name_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(PACKAGED_SUITES, "claw-bench",
                        dataclasses.replace(CLAW_BENCH, distribution="orchard-no-such-distribution"))
    assert "claw-bench" not in available_suites()
    with pytest.raises(NotFound, match=r"suite 'claw-bench' is read from the PyPI package orchard-no-such-"
                                       r"distribution, which is not installed: pip install 'orchard-no-such-"
                                       r"distribution==0.1.0' \(or Orchard's extra: pip install 'orchard\[claw-bench"):
        load_suite("claw-bench")


def _copy(tmp_path: Path, name: str) -> Path:
    task = tmp_path / "suite" / "sales" / name
    shutil.copytree(MINI_TASK, task)
    return task


def test_broken_scripts_and_missing_inputs_are_found_from_the_files(tmp_path):
    (tmp_path / "suite" / "_schema").mkdir(parents=True)  # skipped, as claw-bench's own loader does
    good = _copy(tmp_path, "good")
    assert LOAD_ERROR_KEY not in load_task_dir(good).metadata
    unparsable = _copy(tmp_path, "unparsable")
    solve = unparsable / "solution" / "solve.sh"
    solve.write_text(solve.read_text().replace('WORKSPACE="${1:-workspace}"', 'for x in (; do'))
    missing = _copy(tmp_path, "missing")
    (missing / "environment" / "data" / "sales.csv").unlink()
    tasks = {path: load_task_dir(tmp_path / "suite" / "sales" / path) for path in ("unparsable", "missing")}
    assert tasks["unparsable"].metadata[LOAD_ERROR_KEY].startswith(
        "task mini-001 (unparsable): solution/solve.sh has a syntax error (bash -n): line 4: syntax error near "
        "unexpected token `('")
    assert tasks["missing"].metadata[LOAD_ERROR_KEY] == (
        "task mini-001 (missing): its input data is missing: environment/setup.sh copies from "
        "environment/data/sales.csv, which the task does not have")
    assert tasks["missing"].id == "mini-001" and tasks["missing"].grader is not None  # the task as it reads
    # a directory of domains, each of task directories, is a suite too (claw-bench's tasks/<domain>/<task>/);
    # here the copies share one id, so each after the first is named after its directory
    assert [task.id for task in load_task_dirs(tmp_path / "suite")] == ["mini-001", "missing", "unparsable"]


def test_a_script_cut_off_at_a_variable_names_a_prefix(tmp_path):
    task = _copy(tmp_path, "looped")
    setup = task / "environment" / "setup.sh"
    setup.write_text(setup.read_text().replace('cp "$TASK_DIR/environment/data/sales.csv"',
                                               'for i in 1; do cp "$TASK_DIR/environment/data/sal${i}es.csv"; done; cp '
                                               '"$TASK_DIR/environment/data/sales.csv"'))
    assert LOAD_ERROR_KEY not in load_task_dir(task).metadata  # sal* exists
    setup.write_text(setup.read_text().replace("data/sal${i}", "data/other${i}"))
    assert load_task_dir(task).metadata[LOAD_ERROR_KEY].endswith(
        "copies from environment/data/other*, which the task does not have")


# --- in sandboxes ------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_a_handful_across_domains_validates_and_the_partial_no_ops_are_said(embedded_home):
    checks = await validate_suite("claw-bench", [*HANDFUL, "mem-010", "sys-008"], backend="local")
    by_id = {check.task_id: check for check in checks}
    for task_id in HANDFUL:
        check = by_id[task_id]
        assert (check.valid, check.gold_resolved, check.gold_reward, check.empty_resolved) == (
            True, True, 1.0, False), (task_id, check.problems)
        assert check.noop_partial_credit == (task_id in PARTIAL_NOOPS)
        assert check.empty_reward == pytest.approx(PARTIAL_NOOPS.get(task_id, 0.0), abs=0.01)
    for task_id, reason in NOT_RUNNABLE.items():
        check = by_id[task_id]
        assert (check.valid, check.not_runnable, check.gold_resolved) == (False, True, None)
        assert check.problems[0].startswith(reason)
    assert not await live_sandbox_ids(embedded_home)


@pytest.mark.slow
def test_validate_cli_lists_the_not_runnable_and_the_partial_no_ops(embedded_home):
    done = cli.invoke(app, ["eval", "validate", "--suite", "claw-bench", "--tasks", "code-003,sys-008",
                            "--backend", "local"])
    assert done.exit_code == 1, done.output
    lines = [" ".join(line.split()) for line in done.output.splitlines()]
    assert "2 task(s), 1 invalid" in lines
    assert "1 not runnable (the reasons above): sys-008" in lines
    assert "1 no-op(s) not resolved but earning partial credit: code-003 0.75" in lines
    assert any(line.startswith(f"sys-008: {NOT_RUNNABLE['sys-008']}") for line in lines)


@pytest.mark.slow
async def test_a_run_resolves_with_the_oracle_offline_and_skips_what_cannot_run(embedded_home, tmp_path):
    results = await run_eval(harness="react", model="oracle", suite="claw-bench", task_ids=["xdom-013", "mem-010"],
                             out_dir=tmp_path / "run", gateway_config=eval_gateway_config("oracle"), backend="local")
    by_id = {row.task_id: row for row in results.tasks}
    assert by_id["xdom-013"].status == "resolved"  # its verifier reads <task>/workspace
    assert (by_id["mem-010"].status, by_id["mem-010"].exit_status) == ("error", "environment_error")
    assert by_id["mem-010"].error.endswith(NOT_RUNNABLE["mem-010"])
    assert not await live_sandbox_ids(embedded_home)


# --- docs/suites.md -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_pages_claw_bench_example_runs_as_written(embedded_home, capsys):
    (_, code, line), = doc_blocks.of_kind(ROOT / "docs" / "suites.md", "claw-bench")
    doc_blocks.run_python(code, f"suites.md:{line}", {})
    printed = capsys.readouterr().out.strip().splitlines()
    shown = [comment.removeprefix("# ") for comment in code.splitlines() if comment.startswith("# ")]
    assert printed == shown
