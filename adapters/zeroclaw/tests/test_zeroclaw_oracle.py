"""The oracle model drives zeroclaw as it drives every harness: it finds ZeroClaw's `shell(command)` among its
tools, plays the task's reference patch or solution through it, runs mini-swe-agent's submit command (ZeroClaw
has no submit tool), and then answers without a tool call, which ends ZeroClaw's turn. Every task of swe-mini
and of task-dirs-mini (Harbor's, claw-bench's and Orchard's own task directories, a service graded by its
state, a notes tool over MCP) comes out resolved through the profile: README.md's commands, which
test_zeroclaw_readme.py runs and checks with `resolved_through_shell` below. Here: three swe-mini tasks whose
patches hold every character a shell tool could mangle, through the real-binary path on the stand-in for the
binary."""

from __future__ import annotations

from pathlib import Path

import pytest
from zeroclaw_rig import STANDIN, home_with_cache, orchard, results, trajectories

pytestmark = pytest.mark.slow
ORACLE_SAMPLE = ["orchard__envfile-47", "orchard__pinspec-41", "orchard__inkpost-219"]


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
