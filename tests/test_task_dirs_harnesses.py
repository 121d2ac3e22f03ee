"""eval/task-dirs-mini end to end with the oracle through every built-in harness (react, mini-swe-agent, the
zero-code `cli` harness running mini-swe-agent's own `mini` from its bundle, kimi-cli, openhands): the oracle
plays each task's solve.sh through the harness's own shell tool, and every task (Harbor's on the Debian image
and on an image built from its Dockerfile, claw-bench's on the host image, a mail service graded by its
state, a notes tool over MCP) comes out resolved with the full reward. That a no-op resolves none is checked
by `orchard eval validate` (tests/test_task_dirs.py). The in-sandbox harnesses'
bundles are built at most once per session into the cache every harness test module shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from tests.debian_image import import_debian
from tests.in_sandbox_harness_rig import run_trajectories
from tests.running_server import live_sandbox_ids
from tests.test_harness_cli import documented_options

# Each part of a world inside the sandbox: a claw-bench task (partial scores) of each of two kinds, a Harbor
# task on a prebuilt image and one built from its Dockerfile, a service graded by its state, a tool over MCP.
TASKS = ["mini-001", "mini-003", "harbor-build", "harbor-hello", "mail-service", "notes-mcp"]
HARNESSES = [
    pytest.param("react", (), {}, id="react"),
    pytest.param("mini-swe-agent", (), {}, id="mini-swe-agent"),
    pytest.param("cli", ("mini-swe-agent",), "documented", id="cli", marks=pytest.mark.slow),
    pytest.param("kimi-cli", ("kimi-cli",), {}, id="kimi-cli", marks=pytest.mark.slow),
    pytest.param("openhands", ("openhands",), {}, id="openhands", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def suite_home(tmp_path_factory, session_bundles) -> Path:
    """A home with the session's bundle cache and the Debian image the Harbor task names."""
    home = session_bundles.home(tmp_path_factory.mktemp("task-dirs-home"))
    import_debian(home)
    return home


@pytest.mark.parametrize("harness, bundles, options", HARNESSES)
async def test_the_oracle_resolves_both_dialects_through_each_harness(harness, bundles, options, suite_home,
                                                                      session_bundles, monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHARD_HOME", str(suite_home))
    session_bundles.build(*bundles)
    out = tmp_path / harness
    results = await run_eval(harness=harness, model="oracle", suite="task-dirs-mini", out_dir=out, parallel=2,
                             gateway_config=eval_gateway_config("oracle"), backend="local",
                             harness_options=documented_options() if options == "documented" else options)
    assert {(row.task_id, row.status, row.reward) for row in results.tasks} == {
        (task_id, "resolved", 1.0) for task_id in TASKS}, [row.error for row in results.tasks]
    for trajectory in run_trajectories(out):
        # the reference solution went through the harness's own tool, the base64 of solve.sh intact
        commands = [json.dumps(call.arguments) for step in trajectory.steps for call in step.tool_calls]
        assert any("ORCHARD_TASK_DIR=$(mktemp -d)" in command for command in commands) or any(
            "ORCHARD_TASK_DIR=$(mktemp -d)" in (step.message or "") for step in trajectory.steps), commands
        assert trajectory.outcome.details["pass_threshold"] == 1.0
    assert not await live_sandbox_ids(suite_home)
