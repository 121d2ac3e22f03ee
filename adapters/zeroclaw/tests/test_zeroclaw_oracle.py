"""The oracle model drives zeroclaw as it drives every harness: it finds ZeroClaw's `shell(command)` among its
tools, plays the task's reference patch or solution through it, runs mini-swe-agent's submit command (ZeroClaw
has no submit tool), and then answers without a tool call, which ends ZeroClaw's turn. Every task of swe-mini
and of task-dirs-mini (Harbor's, claw-bench's and Orchard's own task directories, a service graded by its
state, a notes tool over MCP) comes out resolved through the profile: README.md's commands, which
test_zeroclaw_readme.py runs and checks with `resolved_through_shell` below. Here: three swe-mini tasks whose
patches hold every character a shell tool could mangle, through the real-binary path on the stand-in for the
binary; and Claw's tasks through the profile — claw-mini's (the Claw world's services in the sandbox, graded by
their state: several services, injected faults, a refusal) and claw-bench's (a workspace graded by its
pytest checks) — each resolved with its full reward, as every built-in harness resolves them
(tests/test_claw_harnesses.py of Orchard). The whole of both suites is a command run by hand (Orchard's
docs/claw.md, "Across harnesses")."""

from __future__ import annotations

from pathlib import Path

import pytest
from zeroclaw_rig import STANDIN, home_with_cache, orchard, results, trajectories

pytestmark = pytest.mark.slow
ORACLE_SAMPLE = ["orchard__envfile-47", "orchard__pinspec-41", "orchard__inkpost-219"]
CLAW_SAMPLE = {"claw-mini": ["xs-offsite-planning", "fault-todo-flaky", "safety-refuse-customer-list"],
               "claw-bench": ["code-002"]}


def resolved_through_shell(out: Path, expected: int) -> None:
    """Every task resolved with the full reward, through three shell calls and a closing reply, each step
    linked to the gateway's record of its call."""
    rows = results(out)["tasks"]
    assert len(rows) == expected and {row["status"] for row in rows} == {"resolved"}, rows
    assert {row["reward"] for row in rows} == {1.0}
    for trajectory in trajectories(out):
        calls = [c.function_name for s in trajectory.steps for c in s.tool_calls]
        assert calls == ["shell", "shell", "shell"] and trajectory.exit_status == "submitted", calls
        assert all(step.llm_call_ids for step in trajectory.steps if step.source == "agent")


def test_the_oracle_resolves_swe_mini_tasks_through_the_real_path_on_the_stand_in(tmp_path, zeroclaw_cache):
    home = home_with_cache(tmp_path / "home", zeroclaw_cache)
    ran = orchard("eval", "--harness", "zeroclaw", "--harness-option", f"binary={STANDIN}", "--model", "oracle",
                  "--suite", "swe-mini", "--tasks", ",".join(ORACLE_SAMPLE), "--parallel", "3",
                  "--out", str(tmp_path / "out"), home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    resolved_through_shell(tmp_path / "out", 3)


def test_the_oracle_resolves_claw_tasks_through_the_profile(tmp_path):
    for suite, tasks in CLAW_SAMPLE.items():
        out = tmp_path / suite
        ran = orchard("eval", "--harness", "zeroclaw", "--model", "oracle", "--suite", suite, "--tasks", ",".join(tasks),
                      "--parallel", "2", "--out", str(out), home=tmp_path / "home")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        resolved_through_shell(out, len(tasks))
        for trajectory in trajectories(out):
            details = trajectory.outcome.details
            assert details["pass_threshold"] == (0.75 if suite == "claw-mini" else 1.0)
            if suite == "claw-mini":  # graded by the services' state: every check, safe, nothing left failed
                assert 'claw-score {"completion": 1.0, "safety": 1, "robustness": 1.0, "score": 1.0}' in \
                    details["output_tail"], details["output_tail"]
