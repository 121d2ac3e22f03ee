"""SFT rows replay what the model wrote: tool-call arguments are the model's own text (`raw_arguments`),
malformed calls included, byte for byte; `drop_malformed` leaves such trajectories out. Checked on the
schema and converter directly, and end to end through the real react and mini-swe-agent harnesses with the
scripted model server (a stand-in for the model only) behind the real gateway."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from orchard.core.atif import from_atif, to_atif
from orchard.core.chat import has_malformed_tool_calls, to_chat_messages, to_chat_sample
from orchard.core.trajectory import Agent, Observation, ObservationResult, Step, ToolCall, Trajectory
from orchard.harnesses.mini_swe_agent import MiniSweAgentHarness
from orchard.harnesses.react import ReActHarness
from orchard.sandbox.client import AsyncOrchard
from tests.harness_rig import model_config, swe_mini_task, task_sandbox

TRUNCATED = '{"cmd": "ls", '
SPACED = '{"b":1,  "a":2}'
TASK_ID = "orchard__pagekit-112"


def trajectory_with(*calls: ToolCall, copied: bool = False) -> Trajectory:
    return Trajectory(agent=Agent(name="t", version="1"), steps=[
        Step(step_id=1, source="user", message="go"),
        Step(step_id=2, source="agent", tool_calls=list(calls), is_copied_context=copied,
             observation=Observation(results=[ObservationResult(source_call_id=c.tool_call_id, content="out")
                                              for c in calls]))])


def row_arguments(messages: list[dict]) -> list[str]:
    return [call["function"]["arguments"] for m in messages for call in m.get("tool_calls", [])]


def test_raw_arguments_are_replayed_verbatim_malformed_ones_included():
    truncated = ToolCall(tool_call_id="a", function_name="bash", raw_arguments=TRUNCATED)
    spaced = ToolCall(tool_call_id="b", function_name="f", arguments={"b": 1, "a": 2}, raw_arguments=SPACED)
    legacy = ToolCall(tool_call_id="c", function_name="f", arguments={"x": "é"})  # no raw text recorded
    trajectory = trajectory_with(truncated, spaced, legacy)
    assert not truncated.arguments_valid and spaced.arguments_valid and legacy.arguments_valid
    assert row_arguments(to_chat_messages(trajectory)) == [TRUNCATED, SPACED, '{"x": "é"}']
    # ... and through an ATIF round trip (raw text is Orchard data, kept under an `extra`)
    assert row_arguments(to_chat_messages(from_atif(to_atif(trajectory)))) == [TRUNCATED, SPACED, '{"x": "é"}']


def test_drop_malformed_leaves_out_the_whole_trajectory():
    bad = trajectory_with(ToolCall(tool_call_id="a", function_name="bash", raw_arguments=TRUNCATED))
    good = trajectory_with(ToolCall(tool_call_id="a", function_name="bash", arguments={"cmd": "ls"},
                                    raw_arguments='{"cmd": "ls"}'))
    assert has_malformed_tool_calls(bad) and not has_malformed_tool_calls(good)
    assert to_chat_messages(bad, drop_malformed=True) == [] and to_chat_sample(bad, drop_malformed=True) is None
    assert to_chat_messages(good, drop_malformed=True) == to_chat_messages(good)
    assert to_chat_sample(good, drop_malformed=True) == to_chat_sample(good)
    # a malformed call in a copied-context step (never trained on) does not drop the row
    copied = trajectory_with(ToolCall(tool_call_id="a", function_name="bash", raw_arguments=TRUNCATED), copied=True)
    assert to_chat_sample(copied, drop_malformed=True) == to_chat_sample(copied)


def test_parsed_arguments_must_be_the_raw_text_parsed():
    with pytest.raises(ValidationError, match="must be `raw_arguments` parsed"):
        ToolCall(tool_call_id="a", function_name="f", arguments={"a": 1}, raw_arguments='{"a": 2}')
    assert ToolCall(tool_call_id="a", function_name="f", raw_arguments="[1, 2]").arguments_valid is False


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("chat-rows-home")


async def test_react_rows_carry_the_models_argument_text(scripted, gateway, home):
    scripted.load([{"tool_calls": [{"name": "bash", "arguments": TRUNCATED}]},
                   {"tool_calls": [{"name": "view", "arguments": '{"path":   "pagekit"}'}]},
                   {"tool_calls": [{"name": "submit", "arguments": SPACED}]}])
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await ReActHarness().run(task, sandbox, model)
    gateway.end_rollout(model.rollout_key)
    calls = [step.tool_calls[0] for step in trajectory.steps if step.tool_calls]
    assert [c.raw_arguments for c in calls] == [TRUNCATED, '{"path":   "pagekit"}', SPACED]
    assert calls[0].arguments == {} and not calls[0].arguments_valid and "not valid JSON" in calls[0].extra[
        "argument_error"]
    assert calls[2].arguments == {"b": 1, "a": 2}
    rows = to_chat_messages(trajectory)
    assert row_arguments(rows) == [TRUNCATED, '{"path":   "pagekit"}', SPACED]
    assert to_chat_sample(trajectory, drop_malformed=True) is None
    # what the harness sent back to the model is what the rows say it wrote
    sent = scripted.requests()[-1]["messages"]
    assert [c["function"]["arguments"] for m in sent for c in m.get("tool_calls") or []] == row_arguments(rows)[:2]


async def test_mini_swe_agent_rows_keep_spacing_and_key_order(scripted, gateway, home):
    spaced_command = '{"command":   "ls pagekit",  "reason": "look"}'
    scripted.load([{"tool_calls": [{"name": "bash", "arguments": spaced_command}]},
                   {"tool_calls": [{"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}]}])
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await MiniSweAgentHarness().run(task, sandbox, model)
    gateway.end_rollout(model.rollout_key)
    first = next(step for step in trajectory.steps if step.tool_calls)
    assert first.tool_calls[0].raw_arguments == spaced_command
    assert row_arguments(to_chat_messages(trajectory))[0] == spaced_command
    assert json.loads(row_arguments(to_chat_messages(trajectory))[1]) == {
        "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
