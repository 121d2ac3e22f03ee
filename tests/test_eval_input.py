"""Bad input to `orchard eval`, `orchard eval validate` and `orchard study`, through the real CLI: each is refused
before any sandbox starts, on one line without a traceback, with exit status 2 (bad usage, as typer's own usage
errors; 1 means rollouts errored). Also: a resume with an option equal to its default is the same run, and the
per-task error lines are printed whole whatever the terminal's width."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.eval.results import RESULTS_FILE, TRAJECTORIES_FILE
from tests.harness_rig import SWE_MINI_DIR, ScriptedModel, tool_calls
from tests.running_server import live_sandbox_ids

PAGEKIT = "orchard__pagekit-112"
cli = CliRunner()


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


def _eval(home: Path, *args: str, columns: int = 250):
    return cli.invoke(app, ["eval", *args], env={"ORCHARD_HOME": str(home), "COLUMNS": str(columns)})


def _scripted(scripted: ScriptedModel) -> list[str]:
    return ["--harness", "react", "--model", "openai/scripted", "--api-base", f"{scripted.url}/v1", "--api-key",
            "unused"]


def _one_error_line(output: str, *needles: str) -> str:
    """The one line of `output` that holds every needle (an error folded over lines would hold none whole)."""
    lines = [line for line in output.splitlines() if all(needle in line for needle in needles)]
    assert lines, f"no single line holds {needles}:\n{output}"
    return lines[0]


def test_a_suite_with_repos_but_no_tasks_file_is_a_one_line_usage_error(home, tmp_path):
    suite = tmp_path / "suite"
    (suite / "repos").mkdir(parents=True)
    out = tmp_path / "out"
    for result in (_eval(home, "--harness", "react", "--model", "oracle", "--suite", str(suite), "--out", str(out)),
                   _eval(home, "validate", "--suite", str(suite))):
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and not isinstance(result.exception, FileNotFoundError)
        _one_error_line(result.output, "error:", "tasks.jsonl is missing")
    study = cli.invoke(app, ["study", "--harness", "react", "--model", "oracle", "--suite", str(suite), "--out",
                             str(tmp_path / "study")], env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})
    assert study.exit_code == 2, study.output
    _one_error_line(study.output, "error:", "tasks.jsonl is missing")
    assert not out.exists() and not (tmp_path / "study").exists(), "a refused run must write nothing"


def test_an_empty_tasks_file_is_refused_not_a_passing_run_of_nothing(home, tmp_path):
    suite = tmp_path / "empty"
    suite.mkdir()
    (suite / "tasks.jsonl").write_text("")
    out = tmp_path / "out"
    result = _eval(home, "--harness", "react", "--model", "oracle", "--suite", str(suite), "--out", str(out))
    assert result.exit_code == 2, result.output
    _one_error_line(result.output, "error:", "has no tasks")
    assert not out.exists()


def test_a_model_no_provider_serves_is_refused_before_any_sandbox_starts(home, tmp_path):
    out = tmp_path / "out"
    result = _eval(home, "--harness", "react", "--model", "no-such-model-xyz", "--suite", "swe-mini",
                   "--tasks", PAGEKIT, "--out", str(out))
    assert result.exit_code == 2, result.output
    _one_error_line(result.output, "error:", "'no-such-model-xyz' has no provider")
    assert not out.exists(), "the run started (it wrote its output directory) before refusing the model"
    assert not asyncio.run(live_sandbox_ids(home))


def test_validate_names_a_missing_repository_not_gits_complaint(home, tmp_path):
    suite = tmp_path / "suite"
    shutil.copytree(SWE_MINI_DIR, suite)
    shutil.rmtree(suite / "repos" / PAGEKIT)
    result = _eval(home, "validate", "--suite", str(suite), "--tasks", PAGEKIT)
    assert result.exit_code == 1, result.output
    line = _one_error_line(result.output, PAGEKIT, "does not exist")
    assert "repos/<instance_id>" in line
    assert "nothing to commit" not in result.output


def test_a_task_error_line_is_never_folded_at_the_terminals_width(home, tmp_path, scripted):
    suite = tmp_path / "a-suite-directory-with-a-rather-long-name-so-that-the-error-is-wide"
    shutil.copytree(SWE_MINI_DIR, suite)
    shutil.rmtree(suite / "repos" / PAGEKIT)
    result = _eval(home, *_scripted(scripted), "--suite", str(suite), "--tasks", PAGEKIT, "--out",
                   str(tmp_path / "out"), columns=60)
    assert result.exit_code == 1, result.output
    line = _one_error_line(result.output, f"{PAGEKIT} [environment_error]", "does not exist", "repos/<instance_id>/")
    assert len(line) > 60


@pytest.mark.slow
def test_resuming_with_an_option_equal_to_its_default_is_the_same_run(home, tmp_path, scripted):
    scripted.load([tool_calls(("submit", {}))])
    out = tmp_path / "out"
    first = _eval(home, *_scripted(scripted), "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(out))
    assert first.exit_code == 0, first.output
    calls = len(scripted.requests())
    again = _eval(home, *_scripted(scripted), "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(out),
                  "--max-steps", "50")  # react's default step limit
    assert again.exit_code == 0, again.output
    assert "another configuration" not in again.output
    assert len(scripted.requests()) == calls, "the finished task ran again"
    assert (out / TRAJECTORIES_FILE).read_text().count("\n") == 1
    assert json.loads((out / RESULTS_FILE).read_text())["summary"]["finished"] == 1
    other = _eval(home, *_scripted(scripted), "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(out),
                  "--max-steps", "7")
    assert other.exit_code == 2, other.output
    _one_error_line(other.output, "another configuration", "step_limit")
