"""The harness conformance suite's checks catch what they are for: each is run on a made-up rollout that
breaks its rule (built here, no harness run) and must fail, and on one that keeps it and must pass. The
suite's runs of real harnesses are in tests/test_harness_conformance.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchard.core.errors import SandboxLost
from orchard.core.run_status import PhaseRecord
from orchard.core.trajectory import (Agent, LLMCall, Observation, ObservationResult, Outcome, Step, ToolCall,
                                     Trajectory)
from orchard.testing.harness_conformance import ConformanceRun, HarnessConformance, LostSandboxRun
from orchard.testing.harness_conformance.model import LOGPROB
from orchard.testing.harness_conformance.scenarios import DEADLINE, MODEL_ERROR, SOLVE
from orchard.testing.memory_sandbox import MemorySandbox

REQUEST = SimpleNamespace(node=SimpleNamespace(originalname="any"))


def _trajectory(*, answered: bool = True, linked: bool = True, duration_s: float = 5.0,
                exit_status: str = "submitted") -> Trajectory:
    call = LLMCall(id="llm-1", completion_token_ids=[1, 2], prompt_token_ids=[3], logprobs=[LOGPROB] * 2)
    results = [ObservationResult(source_call_id="call_1", content="hello\n")] if answered else []
    agent = Step(step_id=2, source="agent", message="write it",
                 tool_calls=[ToolCall(tool_call_id="call_1", function_name="bash", arguments={"command": "ls"})],
                 observation=Observation(results=results) if results else None,
                 llm_call_ids=["llm-1"] if linked else [])
    return Trajectory(agent=Agent(name="made-up", version="1"), llm_calls=[call], exit_status=exit_status,
                      notes="stopped: time limit" if exit_status != "submitted" else None,
                      steps=[Step(step_id=1, source="user", message="task"), agent],
                      phases=[PhaseRecord(name="agent", result="ok", duration_s=duration_s, timeout_s=10.0)])


def _run(**changes: Trajectory) -> ConformanceRun:
    trajectories = {SOLVE: _trajectory(), DEADLINE: _trajectory(exit_status="time_limit"),
                    MODEL_ERROR: _trajectory(exit_status="model_error"), **changes}
    return ConformanceRun(harness=None, results=None, trajectories=trajectories, out_dir=Path("."))


CHECKS = HarnessConformance()


def test_a_tool_call_without_its_observation_fails_the_pairing_check():
    CHECKS.test_every_tool_call_is_paired_with_its_observation(_run(), REQUEST)
    with pytest.raises(AssertionError, match="made tool calls"):
        CHECKS.test_every_tool_call_is_paired_with_its_observation(_run(**{SOLVE: _trajectory(answered=False)}),
                                                                   REQUEST)
    # the deadline rollout's last step may still be waiting for its command
    CHECKS.test_every_tool_call_is_paired_with_its_observation(
        _run(**{DEADLINE: _trajectory(answered=False, exit_status="time_limit")}), REQUEST)


def test_a_harness_cut_off_at_the_deadline_fails_the_deadline_check():
    CHECKS.test_a_short_deadline_stops_the_harness_before_it_and_it_says_so(_run(), REQUEST)
    cut_off = _trajectory(duration_s=10.0, exit_status="time_limit")
    with pytest.raises(AssertionError, match="cut it off at its deadline"):
        CHECKS.test_a_short_deadline_stops_the_harness_before_it_and_it_says_so(_run(**{DEADLINE: cut_off}), REQUEST)
    silent = _trajectory(exit_status="submitted")
    with pytest.raises(AssertionError, match="stopped in time but ended 'submitted'"):
        CHECKS.test_a_short_deadline_stops_the_harness_before_it_and_it_says_so(_run(**{DEADLINE: silent}), REQUEST)


def test_a_step_that_names_no_model_call_fails_the_token_check():
    CHECKS.test_token_ids_and_logprobs_reach_every_agent_step(_run(), REQUEST)
    with pytest.raises(AssertionError, match="names no model call"):
        CHECKS.test_token_ids_and_logprobs_reach_every_agent_step(_run(**{SOLVE: _trajectory(linked=False)}), REQUEST)


def test_a_lost_sandbox_must_be_an_orchard_error_or_a_sandbox_error():
    used = MemorySandbox()
    used.lose()
    with pytest.raises(SandboxLost):  # the harness's first call, as the suite's run makes it
        asyncio.run(used.exec("true"))
    check = CHECKS.test_a_lost_sandbox_is_an_orchard_error_not_an_attempt
    check(LostSandboxRun(used, None, SandboxLost("gone")), REQUEST)
    check(LostSandboxRun(used, _trajectory(exit_status="sandbox_error").model_copy(
        update={"outcome": Outcome(error="sandbox failed")}), None), REQUEST)
    with pytest.raises(AssertionError, match="raised KeyError"):
        check(LostSandboxRun(used, None, KeyError("x")), REQUEST)
    with pytest.raises(AssertionError, match="returned exit_status 'submitted'"):
        check(LostSandboxRun(used, _trajectory(), None), REQUEST)
    with pytest.raises(AssertionError, match="never used its sandbox"):
        check(LostSandboxRun(MemorySandbox(), None, SandboxLost("gone")), REQUEST)
