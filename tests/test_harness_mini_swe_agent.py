"""The mini-swe-agent harness end to end on real parts: the real `mini-swe-agent` package's DefaultAgent and
config files, a swe-mini task in a real embedded sandbox (prepared and graded as the evaluator does), the
real gateway over HTTP, and behind it the scripted OpenAI-compatible server, which stands in for the model
only (a real model cannot be run here deterministically): it replays `bash` tool calls that inspect the
repository, fix the bug with sed, run the tests and submit with mini-swe-agent's submit command."""

from __future__ import annotations

import asyncio
import threading

import pytest
from minisweagent.models.utils.actions_toolcall import BASH_TOOL

from orchard.core.deadline import Deadline
from orchard.core.chat import to_chat_messages
from orchard.core.errors import InvalidRequest
from orchard.core.harness import ModelConfig, get_harness
from orchard.harnesses.mini_swe_agent import MiniSweAgentHarness
from orchard.sandbox.client import AsyncOrchard
from tests.harness_rig import (assert_valid_and_linked, grade, model_config, normalized, swe_mini_task, task_sandbox,
                               tool_calls)
from tests.running_server import free_port

TASK_ID = "orchard__pagekit-112"
SED_FIX = "sed -i 's|return self.total // self.per_page|return -(-self.total // self.per_page)|' pagekit/paginator.py"
REPRO = "python -c 'from pagekit import paginate; p = paginate(list(range(45)), page=3, per_page=20); print(p.items)'"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

SOLVING_SCRIPT = [
    tool_calls(("bash", {"command": "cat pagekit/paginator.py"}),
               ("bash", {"command": "python -m pytest -q 2>&1 | tail -1"}),
               content="THOUGHT: read the paginator and run the tests.", reasoning="Start from the code."),
    {"content": "The page count floors the division; I will round it up."},  # no tool call: a format error
    tool_calls(("bash", {"command": SED_FIX}), content="THOUGHT: round up with negated floor division."),
    tool_calls(("bash", {"command": f"{REPRO} && python -m pytest -q 2>&1 | tail -1"})),
    tool_calls(("bash", {"command": SUBMIT})),
]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("mini-home")


def agent_sources(trajectory) -> list[str]:
    return [step.source for step in trajectory.steps]


@pytest.mark.slow
async def test_mini_swe_agent_solves_a_swe_mini_task_through_the_gateway(scripted, gateway, home):
    scripted.load(SOLVING_SCRIPT)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await get_harness("mini-swe-agent").run(task, sandbox, model)
        patch, outcome = await grade(orch, task, sandbox)

    assert trajectory.outcome is None and trajectory.exit_status == "submitted"
    assert outcome.resolved, outcome.details
    assert "-(-self.total // self.per_page)" in patch
    assert_valid_and_linked(trajectory)
    assert trajectory.agent.name == "mini-swe-agent" and "+minisweagent.2." in trajectory.agent.version
    assert trajectory.agent.tool_definitions == [BASH_TOOL]

    # system + instance prompts are the package's `mini` config, rendered with the sandbox's uname
    system, instance = trajectory.steps[0], trajectory.steps[1]
    assert system.message.startswith("You are a helpful assistant that can interact with a computer.")
    assert task.instruction in instance.message and "Linux" in instance.message
    assert agent_sources(trajectory) == ["system", "user", "agent", "user", "agent", "agent", "agent"]
    first = trajectory.steps[2]
    assert first.reasoning_content == "Start from the code."
    assert first.extra["actions"] == ["cat pagekit/paginator.py", "python -m pytest -q 2>&1 | tail -1"]
    code, tests_run = (result.content for result in first.observation.results)
    assert "return self.total // self.per_page" in code and '"returncode": 0' in code
    assert "4 passed" in tests_run
    format_error = trajectory.steps[3]
    assert format_error.extra["interrupt_type"] == "FormatError" and "No tool calls found" in format_error.message
    assert format_error.extra["rejected_response"]["choices"][0]["message"]["content"].startswith("The page count")
    assert "[40, 41, 42, 43, 44]" in trajectory.steps[5].observation.results[0].content
    submit = trajectory.steps[6]
    assert submit.tool_calls[0].arguments == {"command": SUBMIT}
    (submitted,) = submit.observation.results  # the run ended in this call: the exit is its result
    assert submitted.source_call_id == submit.tool_calls[0].tool_call_id
    assert submitted.extra == {"exit_status": "Submitted"}

    native = trajectory.extra["mini_swe_agent"]
    assert native["trajectory_format"] == "mini-swe-agent-1.1" and native["info"]["exit_status"] == "Submitted"
    assert native["info"]["config"]["environment_type"].endswith("OrchardSandboxEnvironment")
    assert [m["role"] for m in native["messages"]][-1] == "exit"
    assert trajectory.final_metrics.n_llm_calls == len(SOLVING_SCRIPT)

    calls = gateway.end_rollout(model.rollout_key)
    assert len(calls) == len(SOLVING_SCRIPT) and {call.rollout_key for call in calls} == {model.rollout_key}
    recorded_ids = [call.response["id"] for call in calls]
    assert recorded_ids[1] == format_error.extra["rejected_response"]["id"]
    step_ids = [step.extra["response_id"] for step in trajectory.steps if step.source == "agent"]
    assert recorded_ids[:1] + recorded_ids[2:] == step_ids
    # What the model was last sent is the trajectory as chat messages (its last step aside).
    sent = calls[-1].request_messages
    assert normalized(to_chat_messages(trajectory)[:len(sent)]) == normalized(sent)
    request = scripted.requests()[-1]
    assert request["tools"] == [BASH_TOOL] and "drop_params" not in request


async def test_step_limit_stops_cleanly_and_long_output_is_cut_by_the_package_template(scripted, gateway, home):
    scripted.load([tool_calls(("bash", {"command": "seq 1 20000"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await MiniSweAgentHarness(step_limit=2).run(task, sandbox, model)
    assert trajectory.outcome is None and trajectory.exit_status == "step_limit"
    assert trajectory.extra["mini_swe_agent"]["info"]["exit_status"] == "LimitsExceeded"
    assert agent_sources(trajectory).count("agent") == 2 and trajectory.notes.startswith("stopped:")
    assert len(gateway.end_rollout(model.rollout_key)) == 2
    observation = trajectory.steps[-1].observation.results[0].content
    assert len(observation) < 15_000 and '"elided_chars": ' in observation and "19999\\n20000\\n" in observation
    assert_valid_and_linked(trajectory)


async def test_command_timeout_is_reported_as_the_package_does(scripted, gateway, home):
    scripted.load([tool_calls(("bash", {"command": "echo begun; sleep 10"}))])
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await MiniSweAgentHarness(step_limit=1, command_timeout_s=1).run(task, sandbox, model)
    gateway.end_rollout(model.rollout_key)
    result = trajectory.steps[-1].observation.results[0]
    assert result.extra["returncode"] == -1
    assert "timed out after 1 seconds" in result.extra["exception_info"] and "begun" in result.content


async def test_the_evaluators_deadline_stops_a_hanging_command_and_the_loop_before_it(scripted, gateway, home):
    """ModelConfig.deadline is when the evaluator would cut the harness off: a command that would outlast it
    (under a 60 s command timeout) is stopped a margin before it (orchard/harnesses/deadline.py) and the
    package's own loop ends on its wall-time limit, a time limit with the steps so far."""
    scripted.load([tool_calls(("bash", {"command": "echo begun; sleep 60"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway).model_copy(update={"deadline": Deadline.after(8)})
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await MiniSweAgentHarness(command_timeout_s=60).run(task, sandbox, model)
    gateway.end_rollout(model.rollout_key)
    assert trajectory.outcome is None and trajectory.exit_status == "time_limit", trajectory.notes
    assert not model.deadline.expired, "the loop ran past the evaluator's deadline"
    result = trajectory.steps[-1].observation.results[0]
    assert result.extra["returncode"] == -1 and "begun" in result.content


async def test_text_mode_parses_actions_from_the_reply(scripted, gateway, home):
    scripted.load([{"content": "THOUGHT: list.\n\n```mswea_bash_command\nls pagekit\n```"},
                   {"content": f"THOUGHT: done.\n\n```mswea_bash_command\n{SUBMIT}\n```"}])
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await MiniSweAgentHarness(mode="text").run(task, sandbox, model)
    gateway.end_rollout(model.rollout_key)
    assert trajectory.exit_status == "submitted" and trajectory.agent.tool_definitions == []
    listing = trajectory.steps[2]
    assert listing.tool_calls == [] and listing.extra["actions"] == ["ls pagekit"]
    assert listing.observation.results[0].source_call_id is None
    assert "paginator.py" in listing.observation.results[0].content
    assert "tools" not in scripted.requests()[-1]


async def test_unreachable_model_and_lost_sandbox_are_error_outcomes(gateway, home):
    task = swe_mini_task(TASK_ID)
    nothing_there = ModelConfig(model="policy", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout_s=5)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await MiniSweAgentHarness().run(task, sandbox, nothing_there)
        assert trajectory.outcome.error.startswith("model call failed: cannot reach the model endpoint")
        assert trajectory.exit_status == "model_error"
        assert agent_sources(trajectory) == ["system", "user"]
        assert trajectory.extra["mini_swe_agent"]["messages"][-1]["extra"]["exit_status"] == "ModelCallFailed"
        assert_valid_and_linked(trajectory)

        await sandbox.close()  # the sandbox is gone before the harness starts
        lost = await MiniSweAgentHarness().run(task, sandbox, model_config(gateway))
    assert lost.outcome.error.startswith("sandbox failed") and lost.exit_status == "sandbox_error"


async def test_cancelling_the_harness_stops_the_agent_thread(scripted, gateway, home):
    scripted.load([tool_calls(("bash", {"command": "sleep 30"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        run = asyncio.create_task(MiniSweAgentHarness(command_timeout_s=60).run(task, sandbox, model))
        for _ in range(300):  # until the agent's command runs in the sandbox (well under a second unloaded)
            if (await sandbox.exec("pgrep -fx 'sleep 30'")).exit_code == 0:
                break
            await asyncio.sleep(0.1)
        assert any(t.name.startswith("mini-swe-agent:") for t in threading.enumerate())  # busy in `sleep 30`
        assert (await sandbox.exec("pgrep -fx 'sleep 30'")).exit_code == 0
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        for _ in range(50):
            if not any(t.name.startswith("mini-swe-agent:") for t in threading.enumerate()):
                break
            await asyncio.sleep(0.1)
        assert not any(t.name.startswith("mini-swe-agent:") for t in threading.enumerate())
    gateway.end_rollout(model.rollout_key)


def test_registry_and_config_errors():
    harness = get_harness("mini-swe-agent", step_limit=4, overrides={"environment": {"env": {"X": "1"}}})
    assert isinstance(harness, MiniSweAgentHarness) and harness.agent_config["step_limit"] == 4
    assert harness.config["environment"]["env"]["X"] == "1" and "PAGER" in harness.config["environment"]["env"]
    assert MiniSweAgentHarness("swebench").agent_config["step_limit"] == 250  # the package's SWE-bench config
    with pytest.raises(InvalidRequest, match="no mini-swe-agent config 'no-such-config'"):
        MiniSweAgentHarness("no-such-config")
    with pytest.raises(InvalidRequest, match="agent_class 'interactive'"):
        MiniSweAgentHarness(overrides={"agent": {"agent_class": "interactive"}})
    with pytest.raises(InvalidRequest, match="mode"):
        MiniSweAgentHarness(mode="xml")
