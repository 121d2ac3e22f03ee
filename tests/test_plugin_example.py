"""The worked plugin example (examples/orchard-hello-harness) as a user gets it: built and installed by pip
(into a temporary target directory, put on PYTHONPATH of the commands run), found by `orchard harness list`
through its entry point, and run by `orchard eval` on a real swe-mini task with the oracle model."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.core.atif import to_atif
from orchard.eval.results import read_results, read_trajectories
from tests.atif_spec import validate_atif
from tests.running_server import live_sandbox_ids, remove_live_sandboxes

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "orchard-hello-harness"
TASK = "orchard__retrykit-15"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("hello-site")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(EXAMPLE)],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    assert build.returncode == 0, build.stdout + build.stderr
    assert list(target.glob("orchard_hello_harness-0.1.0.dist-info/entry_points.txt"))
    return target


def orchard(site: Path, *args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "200"}
    if home is not None:
        env["ORCHARD_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "orchard.cli.main", *args], capture_output=True, text=True,
                          timeout=280, env=env)


@pytest.mark.slow
def test_the_installed_plugin_is_listed(installed):
    listed = orchard(installed, "harness", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "│ hello" in line)
    assert "plugin" in row and "orchard-hello-harness" in row and "0.1.0" in row
    assert "orchard_hello_harness:HelloHarness" in row


@pytest.mark.slow
def test_orchard_eval_runs_the_plugin_on_a_task(installed, tmp_path):
    home, out = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    try:
        ran = orchard(installed, "eval", "--harness", "hello", "--model", "oracle", "--suite", "swe-mini",
                      "--tasks", TASK, "--out", str(out), home=home)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        results = read_results(out)
        (row,) = results.tasks
        assert (results.settings.harness, row.task_id, row.status) == ("hello", TASK, "resolved")
        assert row.n_llm_calls >= 2 and row.steps >= 4
        # the response ids the plugin kept in extra["response_id"] became links to the gateway's records
        (trajectory,) = read_trajectories(out)
        agent_steps = [step for step in trajectory.steps if step.source == "agent"]
        assert agent_steps and all(step.llm_call_ids for step in agent_steps)
        assert {i for step in agent_steps for i in step.llm_call_ids} <= {call.id for call in trajectory.llm_calls}
        assert all(call.raw_arguments is not None for step in agent_steps for call in step.tool_calls)
        validate_atif(to_atif(trajectory))
        assert not asyncio.run(live_sandbox_ids(home))
    finally:
        remove_live_sandboxes(home)


# What a plug-in author runs for their harness (docs/harness-conformance.md): here only the deadline area.
CONFORMANCE = '''
from orchard.testing.harness_conformance import HarnessConformance


class TestHello(HarnessConformance):
    harness = "hello"
'''


@pytest.mark.slow
def test_the_plugin_stops_before_the_deadline_as_the_conformance_suite_asks(installed, tmp_path):
    (tmp_path / "test_hello_conformance.py").write_text(CONFORMANCE)
    home = tmp_path / "home"
    home.mkdir()
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "deadline",
                          str(tmp_path / "test_hello_conformance.py")], capture_output=True, text=True, timeout=280,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed), "ORCHARD_HOME": str(home)})
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-2000:]
