"""Partial scores and repeated attempts: the estimators (pass@k, pass^k, the Wilson interval) on cases worked by
hand, a suite's pass threshold, and `orchard eval --attempts K` end to end on real parts — a script-graded
task in real embedded sandboxes, the react harness, the run's gateway in front of the scripted model server
(the stand-in for the model: each rollout's replies are the next ones of its script, so with one trial at a
time the test knows which rollout writes which reward), then `orchard report` and the ATIF export. Also runs
the Python examples of docs/evaluation.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.atif import to_atif
from orchard.core.jsonl import read_jsonl
from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.core.task_suite import TaskSuite
from orchard.core.trajectory import Trajectory
from orchard.eval.estimators import mean_pass_k, pass_at_k, pass_hat_k, wilson_interval
from orchard.eval.matrix import matrix_rows
from orchard.eval.results import (RESULTS_FILE, TRAJECTORIES_FILE, EvalResults, EvalSettings, EvalSummary,
                                  TaskResult, read_results)
from orchard.eval.runner import run_eval
from orchard.eval.summary import matrix_table
from orchard.sandbox.client import AsyncOrchard
from tests import doc_blocks
from tests.harness_rig import SCRIPTED, scripted_config, tool_calls
from tests.running_server import live_sandbox_ids

DOC = doc_blocks.ROOT / "docs" / "evaluation.md"
SUBMIT = tool_calls(("submit", {}))
cli = CliRunner()


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


def bash(command: str) -> dict:
    return tool_calls(("bash", {"command": command}))


def reward(value: str) -> list[dict]:
    """One rollout's replies: write `value` into the reward file, then submit."""
    return [bash(f"echo {value} > reward.txt"), SUBMIT]


BREAK_THE_GRADER = [bash("touch broken"), SUBMIT]  # the grader cannot start: a grader_error, not an attempt
# The grader runs in the agent's sandbox: exit 127 says it could not be started (a grader_error).
PARTIAL = Task(id="partial", instruction="Write your score into reward.txt.",
               environment=TaskEnvironment(image="host", workdir="/workspace"),
               grader=ScriptGrader(script="test ! -e broken || exit 127; test -f reward.txt",
                                   reward_file="/workspace/reward.txt"))


def trajectories(out: Path) -> list[Trajectory]:
    return read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False)


# --- the estimators -----------------------------------------------------------------------------------

def test_pass_at_k_and_pass_hat_k_on_hand_computed_cases():
    # pass@k = 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)=3 of C(4,2)=6 pairs miss the success
    assert pass_at_k(3, 2, 2) == 1.0  # every pair of 3 holds one of the 2 successes
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # only the 3 failures together miss: C(3,3)/C(5,3)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 5) == 1.0
    # pass^k = C(c, k) / C(n, k)
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)  # one pair of the 6 is both successes
    assert pass_hat_k(3, 2, 2) == pytest.approx(1 / 3)
    assert pass_hat_k(5, 4, 3) == pytest.approx(4 / 10)  # C(4,3)=4 of C(5,3)=10
    assert pass_hat_k(3, 2, 3) == 0.0 and pass_hat_k(3, 3, 3) == 1.0
    # k = 1: both are c / n (the resolve rate)
    assert pass_at_k(6, 2, 1) == pytest.approx(2 / 6) and pass_hat_k(6, 2, 1) == pytest.approx(2 / 6)
    # fewer attempts than k: not computable, never made up
    assert pass_at_k(2, 1, 3) is None and pass_hat_k(2, 2, 3) is None
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 0)


def test_a_cells_pass_at_k_is_a_mean_over_all_its_tasks_or_not_computable():
    both = mean_pass_k([(3, 2), (3, 0)], 2)  # (1 + 0) / 2 and (1/3 + 0) / 2
    assert (both.pass_at_k, both.pass_hat_k, both.tasks, both.short) == (0.5, pytest.approx(1 / 6), 2, 0)
    # one task with 2 attempts of 3: no mean over the other task alone
    short = mean_pass_k([(3, 2), (2, 2)], 3)
    assert (short.pass_at_k, short.pass_hat_k, short.tasks, short.short) == (None, None, 1, 1)


def test_the_wilson_interval_is_honest_at_0_and_100_percent():
    none, half, all_ = wilson_interval(0, 6), wilson_interval(3, 6), wilson_interval(6, 6)
    z2 = 1.959963984540054 ** 2
    assert (none.low, none.high) == (0.0, pytest.approx(z2 / (6 + z2)))  # 0%–39%
    assert (all_.low, all_.high) == (pytest.approx(6 / (6 + z2)), 1.0)  # 61%–100%, not 100%–100%
    assert (half.low, half.high) == (pytest.approx(0.1876, abs=1e-4), pytest.approx(0.8124, abs=1e-4))
    assert f"{all_.low:.0%}–{all_.high:.0%}" == "61%–100%" and f"{none.low:.0%}–{none.high:.0%}" == "0%–39%"
    wider = wilson_interval(6, 6, confidence=0.99)
    assert wider.low < all_.low and wider.confidence == 0.99
    assert wilson_interval(60, 60).low > all_.low  # more tasks, narrower
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(7, 6)


def _all_resolved_run(tasks: int) -> EvalResults:
    rows = [TaskResult(task_id=f"t{i}", attempt=1, rollout_key=None, status="resolved", exit_status="submitted")
            for i in range(tasks)]
    settings = EvalSettings(harness="react", model="m", suite="s", task_ids=[row.task_id for row in rows])
    return EvalResults(run_id="r", settings=settings, started_at="", updated_at="", tasks=rows,
                       summary=EvalSummary.of(rows, tasks))


def test_the_matrix_prints_6_of_6_as_61_to_100_percent():
    (row,) = matrix_rows([_all_resolved_run(6)])
    assert (row.resolve_rate, row.interval) == (1.0, wilson_interval(6, 6))
    console = Console(width=240, record=True)
    console.print(matrix_table([row]))
    text = console.export_text()
    assert "61%–100%" in text and "100%–100%" not in text


# --- the pass threshold -------------------------------------------------------------------------------

def test_a_suite_declares_its_pass_threshold_in_suite_json(tmp_path):
    TaskSuite(name="partial", pass_threshold=0.5, tasks=[PARTIAL]).save(tmp_path / "suite")
    assert json.loads((tmp_path / "suite" / "suite.json").read_text())["pass_threshold"] == 0.5
    assert TaskSuite.load(tmp_path / "suite").pass_threshold == 0.5
    assert TaskSuite(name="default").pass_threshold == 1.0


def test_a_pass_threshold_outside_0_to_1_is_refused_before_anything_runs(home, tmp_path, scripted):
    TaskSuite(name="partial", tasks=[PARTIAL]).save(tmp_path / "suite")
    for value in ("0", "1.5"):
        result = cli.invoke(app, ["eval", "--harness", "react", "--model", "openai/scripted", "--api-base",
                                  f"{scripted.url}/v1", "--api-key", "unused", "--suite", str(tmp_path / "suite"),
                                  "--pass-threshold", value, "--out", str(tmp_path / "never")],
                            env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})
        assert result.exit_code == 2 and "pass threshold" in result.output, result.output
    assert not (tmp_path / "never").exists()


# --- orchard eval --attempts, end to end --------------------------------------------------------------

def test_orchard_eval_attempts_3_gives_each_task_3_finished_attempts_and_the_report_its_pass_at_k(
        home, tmp_path, scripted):
    """One task, 3 attempts, the suite passing at 0.5: the first rollout breaks the grader (an error, not an
    attempt; --error-retries 1 replaces it), then rewards 1, 0.25 and 0.5 — resolved, failed (under the
    threshold), resolved. n = 3, c = 2: pass@1 67%, pass@2 = pass@3 = 100%, pass^2 = 1/3, pass^3 = 0."""
    suite = tmp_path / "suite"
    TaskSuite(name="partial", pass_threshold=0.5, tasks=[PARTIAL]).save(suite)
    # one trial at a time, attempts queued in order; the errored rollout's replacement runs last
    scripted.load(BREAK_THE_GRADER + reward("1") + reward("0.25") + reward("0.5"))
    out = tmp_path / "run"
    result = cli.invoke(app, ["eval", "--harness", "react", "--model", "openai/scripted", "--api-base",
                              f"{scripted.url}/v1", "--api-key", "unused", "--suite", str(suite), "--parallel", "1",
                              "--attempts", "3", "--error-retries", "1", "--out", str(out)],
                        env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    recorded = trajectories(out)
    assert [(t.rollout_key.rsplit(":", 1)[1], t.exit_status, t.outcome.reward, t.outcome.resolved)
            for t in recorded] == [("1", "grader_error", None, None), ("2", "submitted", 1.0, True),
                                   ("3", "submitted", 0.25, False), ("4", "submitted", 0.5, True)]
    assert all(t.outcome.details["pass_threshold"] == 0.5 for t in recorded[1:])

    results = read_results(out)
    assert results.settings.config().pass_threshold == 0.5 and results.settings.attempts == 3
    (row,) = results.tasks
    assert [(a.rollout, a.status, a.reward) for a in row.attempts] == [
        (2, "resolved", 1.0), (3, "failed", 0.25), (4, "resolved", 0.5)]
    summary = results.summary
    assert (summary.finished, summary.attempts, summary.resolved, summary.short, summary.errors,
            summary.error_rollouts) == (1, 3, 2, 0, 0, 1)
    assert [(e.k, e.pass_at_k, e.pass_hat_k) for e in summary.pass_k] == [
        (1, pytest.approx(2 / 3), pytest.approx(2 / 3)), (2, 1.0, pytest.approx(1 / 3)), (3, 1.0, 0.0)]
    text = " ".join(result.output.split())
    assert "resolved 2/3 attempts (67%" in text and "error rollouts 1 (not attempts)" in text
    assert "pass@1 67%, pass@2 100%, pass@3 100%; pass^2 33%, pass^3 0%" in text

    # the reward and the threshold travel with the trajectory into ATIF (Orchard's extra)
    outcome = to_atif(recorded[2])["extra"]["orchard"]["outcome"]
    assert (outcome["reward"], outcome["resolved"], outcome["details"]["pass_threshold"]) == (0.25, False, 0.5)

    page = tmp_path / "report.html"
    report = cli.invoke(app, ["report", str(out), "--out", str(page)], env={"COLUMNS": "250"})
    assert report.exit_code == 0, report.output
    matrix = report.output[report.output.index("harness × model"):]
    line = next(line for line in matrix.splitlines() if "react" in line and "scripted" in line)
    assert re.search(r"partial \(sha256 \w+, pass ≥ 0\.5\)\s.*\b1\s.*\b3\s.*2/3\s.*67%\s.*k=3: 100%\s.*k=3: 0%",
                     line), line
    html = page.read_text()
    assert "Suite partial (pass ≥ 0.5): harness × model" in html
    passk = html[html.index('class="passk"'):]
    assert re.search(r"<td class=\"num\">67%</td><td class=\"num\">100%</td><td class=\"num\">100%</td>\s*"
                     r"<td class=\"num\">33%</td><td class=\"num\">0%</td>", passk), passk[:2000]
    per_task = html[html.index('class="passk-tasks"'):]
    assert re.search(r"<td>partial</td><td class=\"num\">2 / 3</td>\s*<td>1, 0.25, 0.5</td>", per_task)


async def test_errors_are_not_attempts_a_short_task_says_so_and_resume_runs_only_the_missing_ones(
        home, tmp_path, scripted):
    out = tmp_path / "run"
    suite = TaskSuite(name="partial", pass_threshold=0.5, tasks=[PARTIAL])

    async def evaluate(**options):
        async with AsyncOrchard(home=home) as orchard:
            results = await run_eval(harness="react", model=SCRIPTED, suite=suite, out_dir=out, parallel=1,
                                     gateway_config=scripted_config(scripted), orchard_client=orchard, **options)
        assert not await live_sandbox_ids(home), "the run left sandboxes behind"
        return results

    scripted.load(BREAK_THE_GRADER + reward("0.75"))
    first = await evaluate(attempts=2)  # no error retries: the error stays, the task is short
    (row,) = first.tasks  # its latest rollout (the second) is its one attempt
    assert (row.status, row.attempt, [a.reward for a in row.attempts]) == ("resolved", 2, [0.75])
    summary = first.summary
    assert (summary.short, summary.error_rollouts, summary.attempts, summary.resolve_rate) == (1, 1, 1, 1.0)
    assert [(e.k, e.pass_at_k) for e in first.summary.pass_k] == [(1, 1.0), (2, None)]  # 1 attempt: no pass@2
    assert first.summary.pass_k[1].short == 1

    scripted.load(reward("0"))
    second = await evaluate(attempts=2)  # resumed: only the missing attempt runs
    assert len(scripted.requests()) == 2
    (row,) = second.tasks
    assert [(a.rollout, a.status, a.reward) for a in row.attempts] == [(2, "resolved", 0.75), (3, "failed", 0.0)]
    assert (second.summary.short, second.summary.errors, second.summary.resolve_rate) == (0, 0, 0.5)
    assert [(e.k, e.pass_at_k, e.pass_hat_k) for e in second.summary.pass_k] == [(1, 0.5, 0.5), (2, 1.0, 0.0)]

    scripted.load(reward("0.5"))
    third = await evaluate()  # asking for fewer attempts keeps the run's 2: nothing runs
    assert scripted.requests() == [] and third.settings.attempts == 2
    fourth = await evaluate(attempts=3)  # asking for more adds the missing one
    assert len(scripted.requests()) == 2 and [a.rollout for a in fourth.tasks[0].attempts] == [2, 3, 4]
    assert json.loads((out / RESULTS_FILE).read_text())["summary"]["pass_k"][2] == {
        "k": 3, "pass_at_k": 1.0, "pass_hat_k": 0.0, "tasks": 1, "short": 0}


def test_a_task_short_of_its_attempts_says_how_many_it_has_and_the_run_exits_1(home, tmp_path, scripted):
    suite = tmp_path / "suite"
    TaskSuite(name="partial", tasks=[PARTIAL]).save(suite)
    scripted.load(BREAK_THE_GRADER + reward("1"))
    result = cli.invoke(app, ["eval", "--harness", "react", "--model", "openai/scripted", "--api-base",
                              f"{scripted.url}/v1", "--api-key", "unused", "--suite", str(suite), "--parallel", "1",
                              "--attempts", "2", "--out", str(tmp_path / "run")],
                        env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})
    assert result.exit_code == 1, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("│ partial"))
    assert re.search(r"│\s+2 │\s+1 of 2 │\s+1 │\s+n/a │\s+n/a │", line), line  # rollout 2: 1 attempt of 2
    text = " ".join(result.output.split())
    assert "1 task(s) short of 2 attempts" in text
    assert "1 task(s) have fewer than 2 attempts: rollouts ended in an error (not an attempt of the agent)" in text


# --- docs/evaluation.md -------------------------------------------------------------------------------

def test_the_evaluation_pages_python_runs():
    blocks = doc_blocks.of_kind(DOC, "python")
    assert blocks
    for _, code, line in blocks:
        doc_blocks.run_python(code, f"evaluation.md:{line}", {})
