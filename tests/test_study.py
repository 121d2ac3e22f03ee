"""The cross-harness study (`orchard study`, orchard.eval.study), its matrix (orchard.eval.matrix: the
bootstrap interval, means per attempt, errors apart) and how `orchard report` shows it, in the terminal and
in the HTML page. Also checks every block of docs/cross-harness.md: the small study there is run as written
(react and mini-swe-agent × the oracle on two swe-mini tasks, real embedded sandboxes), with a harness that
does not exist added to show that one failing cell does not stop the matrix. About 30 s."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from rich.console import Console
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.eval.estimators import wilson_interval
from orchard.eval.matrix import bootstrap_interval, matrix_rows, paired_difference
from orchard.eval.results import (EvalResults, EvalSettings, EvalSummary, TaskResult, read_results, read_trajectories,
                                  write_results)
from orchard.eval.run_config import TrialTimeouts
from orchard.eval.study import cell_directory, plan_study, read_study, write_study
from orchard.eval.summary import matrix_table
from orchard.core.errors import InvalidRequest
from orchard.core.harness import SamplingParams
from tests import doc_blocks

DOC = doc_blocks.ROOT / "docs" / "cross-harness.md"
cli = CliRunner()


# --- the bootstrap --------------------------------------------------------------------------------------

def test_the_bootstrap_interval_on_known_data():
    # two tasks, one resolved: the resample rates are 0, 1/2, 1 (1/4, 1/2, 1/4), so the 95% interval is all
    assert bootstrap_interval([True, False]) == bootstrap_interval([False, True])
    two = bootstrap_interval([True, False])
    assert (two.low, two.high, two.confidence) == (0.0, 1.0, 0.95)
    # 50 of 100: close to the normal approximation 0.5 ± 1.96 * 0.05
    half = bootstrap_interval([True] * 50 + [False] * 50)
    assert half.low == pytest.approx(0.402, abs=0.021) and half.high == pytest.approx(0.598, abs=0.021)
    # narrower with more tasks, wider with more confidence
    many = bootstrap_interval([True] * 200 + [False] * 200)
    assert many.high - many.low < half.high - half.low
    wide = bootstrap_interval([True] * 50 + [False] * 50, confidence=0.99)
    assert wide.low <= half.low and wide.high >= half.high
    # seeded: the same every time; another seed may differ but stays close
    assert bootstrap_interval([True] * 7 + [False] * 7) == bootstrap_interval([True] * 7 + [False] * 7)
    other = bootstrap_interval([True] * 7 + [False] * 7, seed=1)
    assert abs(other.low - 3 / 14) <= 1 / 14
    # all or nothing: a point; no attempts: no interval
    assert (bootstrap_interval([True] * 5).low, bootstrap_interval([True] * 5).high) == (1.0, 1.0)
    assert (bootstrap_interval([False] * 3).low, bootstrap_interval([False] * 3).high) == (0.0, 0.0)
    assert bootstrap_interval([]) is None
    with pytest.raises(ValueError):
        bootstrap_interval([True], confidence=1.0)


def test_the_paired_difference_on_known_data():
    # the same outcomes: no difference, and no uncertainty about it
    same = {"a": True, "b": False, "c": True}
    tasks, delta, interval = paired_difference(same, same)
    assert (tasks, delta, interval.low, interval.high) == (3, 0.0, 0.0, 0.0)
    # only shared tasks count; one task of two better: +50 %, interval from 0 to +100 %
    tasks, delta, interval = paired_difference({"a": True, "b": True, "x": True}, {"a": True, "b": False, "y": False})
    assert (tasks, delta, interval.low, interval.high) == (2, 0.5, 0.0, 1.0)
    # 100 of 400 tasks better, none worse: +25 % ± about 1.96 * sqrt(.25 * .75 / 400) = 4.2 points
    better = {str(i): True for i in range(400)}
    worse = {str(i): i >= 100 for i in range(400)}
    tasks, delta, interval = paired_difference(better, worse)
    assert (tasks, delta) == (400, 0.25)
    assert interval.low == pytest.approx(0.208, abs=0.012) and interval.high == pytest.approx(0.292, abs=0.012)
    assert paired_difference(worse, better)[2].high == pytest.approx(-interval.low, abs=0.01)  # the mirror image
    assert paired_difference({"a": True}, {"b": True}) is None


# --- the matrix -----------------------------------------------------------------------------------------

def _run(harness: str, model: str, rows: list[tuple[str, str, int, int, float]], total: int | None = None,
         elapsed: float = 10.0, *, run_id: str | None = None, suite: str = "s", suite_hash: str = "h",
         harness_options: dict | None = None, sampling: SamplingParams | None = None) -> EvalResults:
    tasks = [TaskResult(task_id=task_id, attempt=1, rollout_key=None, status=status, steps=steps,
                        prompt_tokens=tokens, completion_tokens=0, wall_time_s=wall,
                        exit_status="submitted" if status != "error" else "agent_error")
             for task_id, status, steps, tokens, wall in rows]
    total = total if total is not None else len(rows)
    selected = [task_id for task_id, *_ in rows] + [f"unrun-{i}" for i in range(total - len(rows))]
    settings = EvalSettings(harness=harness, model=model, suite=suite, suite_hash=suite_hash,
                            harness_options=harness_options or {}, sampling=sampling or SamplingParams(),
                            timeouts=TrialTimeouts(), task_ids=selected)
    return EvalResults(run_id=run_id or f"{harness}-{model}", settings=settings, started_at="", updated_at="",
                       elapsed_s=elapsed, summary=EvalSummary.of(tasks, total, elapsed), tasks=tasks)


def test_the_matrix_counts_errors_apart_and_averages_over_attempts():
    react = _run("react", "m", [("t0", "resolved", 4, 100, 2.0), ("t1", "failed", 6, 300, 4.0),
                                ("t2", "error", 50, 9999, 99.0)], total=4)
    kimi = _run("kimi-cli", "m", [("t0", "error", 1, 10, 1.0)])
    again = _run("react", "m", [("t3", "resolved", 2, 200, 3.0)], elapsed=5.0)  # a second run of the same cell
    mini = _run("mini-swe-agent", "m", [("t0", "failed", 3, 50, 1.0), ("t1", "resolved", 3, 50, 1.0),
                                        ("t9", "resolved", 3, 50, 1.0)])
    rows = matrix_rows([react, kimi, again, mini])
    assert [(row.harness, row.model, row.runs) for row in rows] == [
        ("react", "m", [0, 2]), ("kimi-cli", "m", [1]), ("mini-swe-agent", "m", [3])]
    cell, broken, other = rows
    # against react (the first harness with model m), over the tasks both attempted: t0 worse, t1 better
    assert (cell.versus, broken.versus) == (None, None)
    assert (other.versus.baseline, other.versus.tasks, other.versus.delta) == ("react", 2, 0.0)
    assert (cell.tasks, cell.finished, cell.attempts, cell.resolved, cell.failed, cell.errors, cell.pending) == (
        5, 3, 3, 2, 1, 1, 1)
    assert cell.resolve_rate == pytest.approx(2 / 3)
    assert cell.interval == wilson_interval(2, 3)  # the 3 tasks the sample
    assert (cell.mean_steps, cell.mean_tokens, cell.mean_wall_s) == (4.0, 200.0, 3.0)  # the error left out
    assert cell.wall_time_s == 15.0
    assert (broken.finished, broken.errors, broken.resolve_rate, broken.interval, broken.mean_steps) == (
        0, 1, None, None, None)

    console = Console(width=240, record=True)
    console.print(matrix_table(rows))
    text = console.export_text()
    for column in ("harness", "model", "resolved", "rate", "95% CI", "errors", "not run", "steps/att.",
                   "tokens/att.", "wall s/att.", "Δ vs first harness"):
        assert column in text
    react_line = next(line for line in text.splitlines() if "react" in line)
    low, high = cell.interval.low, cell.interval.high
    assert re.search(rf"2/3\s.*67%\s.*{low:.0%}–{high:.0%}\s.*\b1\b.*\b1\b.*4\.0.*200.*3\.0", react_line), react_line
    kimi_line = next(line for line in text.splitlines() if "kimi-cli" in line)
    assert re.search(r"0/0\s.*n/a\s.*-\s.*\b1\b", kimi_line), kimi_line
    mini_line = next(line for line in text.splitlines() if "mini-swe-agent" in line)
    interval = other.versus.interval
    assert f"+0% [{interval.low:+.0%}, {interval.high:+.0%}] vs react" in mini_line, mini_line


# --- what makes a cell: the runs' configuration, tasks and their attempts ------------------------------

SIX = [f"t{i}" for i in range(6)]


def _report(tmp_path, *runs: EvalResults) -> tuple[str, str]:
    """`orchard report` over runs written as an `orchard eval` writes them: (terminal output, HTML page)."""
    directories = []
    for index, results in enumerate(runs):
        directories.append(tmp_path / f"run-{index}")
        write_results(directories[-1], results)
    page = tmp_path / "report.html"
    result = cli.invoke(app, ["report", *map(str, directories), "--out", str(page)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output, page.read_text()


def _matrix_lines(output: str) -> list[str]:
    table = output[output.index("harness × model"):]
    return [line for line in table.splitlines() if "react" in line]


def test_runs_that_differ_only_in_harness_options_are_two_cells(tmp_path):
    short = _run("react", "m", [(t, "resolved", 2, 10, 1.0) for t in SIX], run_id="short",
                 harness_options={"step_limit": 5})
    long = _run("react", "m", [(t, "failed", 9, 90, 3.0) for t in SIX], run_id="long",
                harness_options={"step_limit": 50})
    rows = matrix_rows([short, long])
    assert [(row.harness_text, row.finished, row.attempts, row.resolve_rate) for row in rows] == [
        ("react (step_limit=5)", 6, 6, 1.0), ("react (step_limit=50)", 6, 6, 0.0)]
    assert rows[1].versus.baseline == "react (step_limit=5)" and rows[1].versus.delta == -1.0

    output, html = _report(tmp_path, short, long)
    first, second = _matrix_lines(output)
    assert re.search(r"react \(step_limit=5\)\s.*\b6\s.*\b1\s.*6/6\s.*100%", first), first
    assert re.search(r"react \(step_limit=50\)\s.*\b6\s.*\b1\s.*0/6\s.*0%", second), second
    runs = output[:output.index("harness × model")]  # the runs table: each run's options
    assert re.search(r"short\s.*react\s.*step_limit=5\s", runs) and re.search(r"long\s.*step_limit=50\s", runs)
    matrix = html[html.index('class="matrix"'):]
    matrix = matrix[:matrix.index("</table>")]
    assert "<th>react (step_limit=5)</th>" in matrix and "<th>react (step_limit=50)</th>" in matrix
    assert "6 / 6 resolved" in matrix and "0 / 6 resolved" in matrix and "12 attempt" not in matrix
    assert "<td>step_limit=5</td>" in html and "<td>step_limit=50</td>" in html  # the runs table


def test_runs_that_differ_only_in_sampling_are_two_cells():
    cold = _run("react", "m", [(t, "resolved", 2, 10, 1.0) for t in SIX])
    warm = _run("react", "m", [(t, "resolved", 2, 10, 1.0) for t in SIX], sampling=SamplingParams(temperature=0.7))
    assert [(row.model_text, row.finished) for row in matrix_rows([cold, warm])] == [
        ("m", 6), ("m (temperature=0.7)", 6)]


def test_runs_of_one_configuration_on_the_same_tasks_are_attempts_of_those_tasks(tmp_path):
    # t0 resolved twice, t1 once of two, the other four never: 6 tasks with 2 attempts each, not 12 tasks
    first = _run("react", "m", [("t0", "resolved", 2, 10, 1.0), ("t1", "resolved", 2, 10, 1.0)]
                 + [(t, "failed", 4, 20, 2.0) for t in SIX[2:]], run_id="first")
    again = _run("react", "m", [("t0", "resolved", 2, 10, 1.0), ("t1", "failed", 4, 20, 2.0)]
                 + [(t, "failed", 4, 20, 2.0) for t in SIX[2:]], run_id="again")
    (row,) = matrix_rows([first, again])
    assert (row.tasks, row.finished, row.attempts, row.attempts_per_task, row.resolved, row.runs) == (
        6, 6, 12, 2.0, 3, [0, 1])
    assert row.resolve_rate == pytest.approx((1 + 0.5) / 6)  # the mean over tasks of each task's rate
    # the interval's sample is the 6 tasks (the rate 1.5 of 6), not 12 rollouts
    assert row.interval == wilson_interval(1.5, 6)
    assert row.interval != wilson_interval(3, 12)
    # 2 attempts a task: pass@2 (t0, t1 resolved at least once) and pass^2 (t0 both times), over 6 tasks
    assert [(entry.k, entry.pass_at_k, entry.pass_hat_k) for entry in row.pass_k] == [
        (1, pytest.approx(0.25), pytest.approx(0.25)), (2, pytest.approx(2 / 6), pytest.approx(1 / 6))]

    output, html = _report(tmp_path, first, again)
    (line,) = _matrix_lines(output)
    assert re.search(r"react\W+m\W+6\W+2\W+3/12\W+25%", line), line
    matrix = html[html.index('class="matrix"'):]
    assert "3 / 12 resolved" in matrix and "6 task(s), 12 attempt(s)" in matrix


def test_two_suites_with_the_same_name_but_other_contents_are_two_cells(tmp_path):
    here = _run("react", "m", [(t, "resolved", 2, 10, 1.0) for t in SIX], run_id="here", suite="swe-mini",
                suite_hash="a" * 64)
    there = _run("react", "m", [(t, "failed", 2, 10, 1.0) for t in SIX], run_id="there", suite="swe-mini",
                 suite_hash="b" * 64)
    rows = matrix_rows([here, there])
    assert [(row.suite_text, row.resolved, row.attempts) for row in rows] == [
        ("swe-mini (sha256 aaaaaaaaaaaa)", 6, 6), ("swe-mini (sha256 bbbbbbbbbbbb)", 0, 6)]
    assert rows[1].versus is None  # other tasks: nothing to pair

    output, html = _report(tmp_path, here, there)
    assert len(_matrix_lines(output)) == 2
    assert "Suite swe-mini (sha256 aaaaaaaaaaaa): harness × model" in html
    assert "Suite swe-mini (sha256 bbbbbbbbbbbb): harness × model" in html


def test_a_study_plan_grows_and_refuses_another_suite_or_a_shared_directory(tmp_path):
    study = plan_study(tmp_path, ["react"], ["oracle", "openai/x y"], "swe-mini")
    assert [cell.directory for cell in study.cells] == ["react__oracle", "react__openai_x_y"]
    assert cell_directory("kimi-cli", "openai/Qwen/Qwen3") == "kimi-cli__openai_Qwen_Qwen3"
    with pytest.raises(InvalidRequest, match="would share the directory"):
        plan_study(tmp_path, ["react"], ["oracle", "openai/x y", "openai/x_y"], "swe-mini")
    write_study(tmp_path, study)
    grown = plan_study(tmp_path, ["mini-swe-agent"], ["oracle"], "swe-mini")
    assert [(c.harness, c.model) for c in grown.cells] == [("react", "oracle"), ("react", "openai/x y"),
                                                          ("mini-swe-agent", "oracle")]
    assert (grown.harnesses, grown.models) == (["react", "mini-swe-agent"], ["oracle", "openai/x y"])
    with pytest.raises(InvalidRequest, match="holds a study of suite 'swe-mini'"):
        plan_study(tmp_path, ["react"], ["oracle"], "other-suite")


# --- the study, as docs/cross-harness.md runs it --------------------------------------------------------

def _invoke(line: str):
    words = shlex.split(line)
    assert words[0] == "orchard", line
    return cli.invoke(app, words[1:], env={"COLUMNS": "200"})


def test_the_docs_small_study_runs_as_written_and_resumes(tmp_path, monkeypatch, sandbox_home):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHARD_HOME", str(sandbox_home))
    (_, code, line), = doc_blocks.of_kind(DOC, "study-run")
    study_line, report_line = code.strip().splitlines()
    out = tmp_path / "studies" / "small"
    # A harness that does not exist first: its cell fails, the others still run, the command exits 1.
    failing = study_line.replace("--harness react,", "--harness no-such-harness,react,")
    result = _invoke(failing)
    assert result.exit_code == 1, result.output
    study = read_study(out)
    assert [(c.harness, c.status) for c in study.cells] == [
        ("no-such-harness", "failed"), ("react", "finished"), ("mini-swe-agent", "finished")]
    assert "unknown harness 'no-such-harness'" in study.cells[0].error
    assert "did not run: unknown harness" in result.output
    for directory in ("react__oracle", "mini-swe-agent__oracle"):
        results = read_results(out / directory)
        assert (results.summary.resolved, results.summary.errors) == (2, 0), directory
    assert (out / "report.html").is_file()

    # The doc's commands as written: the study resumes (nothing is run again), the report shows the matrix.
    before = {d: len(read_trajectories(out / d)) for d in ("react__oracle", "mini-swe-agent__oracle")}
    result = _invoke(study_line)
    assert result.exit_code == 0, f"docs/cross-harness.md:{line}: {result.output}"
    assert {d: len(read_trajectories(out / d)) for d in before} == before
    result = _invoke(report_line)
    assert result.exit_code == 0, f"docs/cross-harness.md:{line}: {result.output}"
    for harness in ("react", "mini-swe-agent"):
        # 2 of 2 tasks: the Wilson interval is 34%–100%, not a point at 100%
        assert re.search(rf"{harness}\s.*oracle\s.*2/2\s.*100%\s.*34%–100%", result.output), result.output
    assert re.search(r"mini-swe-agent\s.*\+0% \[\+0%, \+0%\] vs react", result.output), result.output
    assert "no-such-harness × oracle did not run" in result.output
    html = (out / "report.html").read_text()
    matrix = html[html.index('class="matrix"'):]
    assert "2 / 2 resolved" in matrix and "95% CI 34%–100%" in matrix
    assert "Wilson score interval" in html and "Study cells that did not run" in html
    assert "+0% [+0%, +0%] vs react" in html
    assert "no-such-harness" in html and json.loads((out / "study.json").read_text())["suite"] == "swe-mini"


# --- the page's other blocks ----------------------------------------------------------------------------

def test_the_pages_commands_parse_and_its_python_runs():
    doc_blocks.check_cli_lines(DOC)
    for _, code, line in doc_blocks.of_kind(DOC, "python"):
        doc_blocks.run_python(code, f"cross-harness.md:{line}", {})
