"""The ReAct harness end to end on real parts: a swe-mini task in a real embedded sandbox (prepared and
graded as the evaluator does), the real gateway over HTTP, and behind it the scripted OpenAI-compatible
server, which stands in for the model only (a real model cannot be run here deterministically): it replays
tool calls that inspect the repository, fix the bug with the harness's own edit tools, run the tests and
submit."""

from __future__ import annotations

import json


import pytest

from orchard.core.deadline import Deadline
from orchard.core.chat import to_chat_messages
from orchard.core.errors import InvalidRequest
from orchard.core.harness import ModelConfig, get_harness
from orchard.gateway.budget import Budget
from orchard.harnesses.react import ReActHarness
from orchard.harnesses.react.tools import TOOL_NAMES, SandboxTools, truncate_middle
from orchard.sandbox.client import AsyncOrchard
from orchard.testing.memory_sandbox import MemorySandbox
from tests.harness_rig import (assert_recorded, assert_valid_and_linked, grade, model_config, normalized, swe_mini_task,
                               task_sandbox, tool_calls)
from tests.running_server import free_port

TASK_ID = "orchard__pagekit-112"
BUGGY_LINE = "        return self.total // self.per_page"
FIXED_LINE = "        return -(-self.total // self.per_page)"
REPRO = "python -c 'from pagekit import paginate; p = paginate(list(range(45)), page=3, per_page=20); print(p.items)'"

SOLVING_SCRIPT = [
    tool_calls(("view", {"path": "."}), ("bash", {"command": "python -m pytest -q 2>&1 | tail -3"}),
               content="Let me look at the repository and run its tests.",
               reasoning="The issue is about the last page; start with the layout."),
    tool_calls(("view", {"path": "pagekit/paginator.py", "view_range": [15, 21]})),
    tool_calls(("str_replace", {"path": "pagekit/paginator.py", "old_str": "self.per_page",
                                "new_str": "self.per_page + 1"})),  # ambiguous on purpose: the tool refuses
    tool_calls(("str_replace", {"path": "pagekit/paginator.py", "old_str": BUGGY_LINE, "new_str": FIXED_LINE})),
    tool_calls(("bash", {"command": f"{REPRO} && python -m pytest -q 2>&1 | tail -1"})),
    tool_calls(("submit", {"summary": "round the page count up"})),
]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("react-home")


@pytest.mark.slow
async def test_react_solves_a_swe_mini_task_through_the_gateway(scripted, gateway, home):
    scripted.load(SOLVING_SCRIPT)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await get_harness("react").run(task, sandbox, model)
        patch, outcome = await grade(orch, task, sandbox)

    assert trajectory.outcome is None and trajectory.exit_status == "submitted"
    assert outcome.resolved, outcome.details
    assert "-(-self.total // self.per_page)" in patch and "tests/" not in patch
    assert_valid_and_linked(trajectory)
    assert trajectory.agent.name == "react" and trajectory.task_id == TASK_ID
    assert trajectory.rollout_key == model.rollout_key
    assert {tool["function"]["name"] for tool in trajectory.agent.tool_definitions} == TOOL_NAMES

    sources = [step.source for step in trajectory.steps]
    assert sources == ["system", "user"] + ["agent"] * len(SOLVING_SCRIPT)
    assert task.instruction in trajectory.steps[1].message
    first = trajectory.steps[2]
    assert first.reasoning_content == "The issue is about the last page; start with the layout."
    assert [call.function_name for call in first.tool_calls] == ["view", "bash"]
    listing, tests_run = (result.content for result in first.observation.results)
    assert "/testbed/pagekit/paginator.py" in listing and "4 passed" in tests_run
    assert "15\t    @property" in trajectory.steps[3].observation.results[0].content
    refused = trajectory.steps[4].observation.results[0]
    assert refused.content.startswith("Error: old_str occurs 2 times") and refused.extra == {"is_error": True}
    assert "Edited /testbed/pagekit/paginator.py" in trajectory.steps[5].observation.results[0].content
    assert "[40, 41, 42, 43, 44]" in trajectory.steps[6].observation.results[0].content
    assert trajectory.final_metrics.n_llm_calls == len(SOLVING_SCRIPT)
    assert trajectory.final_metrics.total_prompt_tokens == sum(s.metrics.prompt_tokens for s in trajectory.steps[2:])

    calls = gateway.end_rollout(model.rollout_key)
    assert_recorded(calls, trajectory, model.rollout_key)
    # The trajectory, as chat messages, is exactly what the model was sent (up to the last reply).
    sent = calls[-1].request_messages
    assert normalized(to_chat_messages(trajectory)[:len(sent)]) == normalized(sent)
    offered = scripted.requests()[-1]["tools"]
    assert {tool["function"]["name"] for tool in offered} == TOOL_NAMES


@pytest.mark.parametrize("limit, options, replies", [
    ("step_limit", {"step_limit": 2}, 2),
    ("token_limit", {"token_limit": 1}, 1),
    ("time_limit", {"wall_time_limit_s": 0.5, "command_timeout_s": 5}, 1),
])
async def test_limits_end_the_run_cleanly(scripted, gateway, home, limit, options, replies):
    scripted.load([tool_calls(("bash", {"command": "sleep 0.6; echo again"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await ReActHarness(**options).run(task, sandbox, model)
    assert trajectory.outcome is None
    assert trajectory.exit_status == limit and trajectory.notes.startswith("stopped:")
    assert [step.source for step in trajectory.steps].count("agent") == replies
    assert "again" in trajectory.steps[-1].observation.results[0].content
    assert_valid_and_linked(trajectory)
    assert len(gateway.end_rollout(model.rollout_key)) == replies


async def test_the_evaluators_deadline_stops_the_loop_cleanly_before_it(scripted, gateway, home):
    """ModelConfig.deadline is when the evaluator would cut the harness off: the loop stops before it, as
    a time limit, with the steps so far and without leaving a command running past it."""
    scripted.load([tool_calls(("bash", {"command": "sleep 30; echo never"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway).model_copy(update={"deadline": Deadline.after(7)})
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await ReActHarness().run(task, sandbox, model)
    assert trajectory.outcome is None and trajectory.exit_status == "time_limit"
    assert not model.deadline.expired, "the loop ran past the evaluator's deadline"
    assert [step.source for step in trajectory.steps].count("agent") == 1
    gateway.end_rollout(model.rollout_key)


async def test_gateway_budget_is_a_limit_not_an_error(scripted, gateway, home):
    scripted.load([tool_calls(("bash", {"command": "true"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    gateway.gateway.start_rollout(model.rollout_key, Budget(max_calls=1))
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await ReActHarness().run(task, sandbox, model)
    assert trajectory.outcome is None and trajectory.exit_status == "budget_exhausted"
    assert [step.source for step in trajectory.steps].count("agent") == 1
    gateway.end_rollout(model.rollout_key)


async def test_long_observations_keep_head_and_tail(scripted, gateway, home):
    scripted.load([tool_calls(("bash", {"command": "seq 1 20000"}))])
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch, task_sandbox(orch, task) as sandbox:
        trajectory = await ReActHarness(step_limit=1, max_observation_chars=1000).run(task, sandbox, model)
    gateway.end_rollout(model.rollout_key)
    content = trajectory.steps[-1].observation.results[0].content
    assert len(content) <= 1000
    assert content.startswith("[exit code 0]\n1\n2\n3\n") and content.endswith("19999\n20000\n")
    assert "characters elided" in content
    full = "[exit code 0]\n" + "".join(f"{n}\n" for n in range(1, 20001))
    assert truncate_middle(full, 1000) == content
    assert truncate_middle("short", 1000) == "short"


async def test_unreachable_model_is_an_error_outcome_with_the_steps_so_far(gateway):
    """The first model call fails, so no command is ever run: the sandbox is the in-memory double, which
    records that the harness asked nothing of it."""
    task = swe_mini_task(TASK_ID)
    behind_gateway = model_config(gateway, model="down")
    nothing_there = ModelConfig(model="policy", base_url=f"http://127.0.0.1:{free_port()}/v1", timeout_s=5)
    sandbox = MemorySandbox(workdir=task.environment.workdir)
    for model, reason in ((behind_gateway, "answered 502: cannot reach model 'openai/down'"),
                          (nothing_there, "cannot reach the model endpoint")):
        trajectory = await ReActHarness().run(task, sandbox, model)
        assert trajectory.outcome is not None and reason in trajectory.outcome.error
        assert trajectory.exit_status == "model_error"
        assert [step.source for step in trajectory.steps] == ["system", "user"]
        assert_valid_and_linked(trajectory)
    assert sandbox.calls == []
    failed = gateway.end_rollout(behind_gateway.rollout_key)
    assert len(failed) == 1 and failed[0].error.startswith("model_unreachable")


async def test_a_lost_sandbox_is_an_error_outcome(scripted, gateway, home):
    scripted.load([tool_calls(("bash", {"command": "ls"}))], loop=True)
    task = swe_mini_task(TASK_ID)
    model = model_config(gateway)
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create(task.environment.sandbox_spec())
        await orch.delete(sandbox.id)  # deleted under the harness: its agent is gone
        trajectory = await ReActHarness().run(task, sandbox, model)
        await sandbox.close()
    gateway.end_rollout(model.rollout_key)
    assert trajectory.outcome.error.startswith("sandbox failed: sandbox ")
    assert trajectory.exit_status == "sandbox_error"
    assert [step.source for step in trajectory.steps] == ["system", "user", "agent"]
    assert_valid_and_linked(trajectory)


async def test_tools_report_mistakes_to_the_model(home):
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create(image="host", workdir="/workspace")
        tools = SandboxTools(sandbox, "/workspace", command_timeout_s=5)
        created = await tools.call("create", {"path": "pkg/mod.py", "content": "a = 1\nb = 2\na = 1\n"})
        assert created.content == "Created /workspace/pkg/mod.py (3 lines)." and not created.is_error
        assert (await tools.call("create", {"path": "pkg/mod.py", "content": "a = 1\nb = 2\na = 1\n"})
                ).content.startswith("Overwrote")
        assert (await tools.call("view", {"path": "pkg/mod.py", "view_range": [2, -1]})).content == (
            "     2\tb = 2\n     3\ta = 1")
        await tools.call("create", {"path": ".cache/state", "content": "hidden"})
        assert (await tools.call("view", {"path": "."})).content == "/workspace\n/workspace/pkg\n/workspace/pkg/mod.py"
        assert (await tools.call("view", {"path": ".cache"})).content == "/workspace/.cache\n/workspace/.cache/state"
        cases = {
            ("view", '{"path": "pkg/mod.py", "view_range": [5, 9]}'): "does not fit /workspace/pkg/mod.py, which has 3",
            ("view", '{"path": "nope.py"}'): "nope.py does not exist",
            ("str_replace", '{"path": "pkg/mod.py", "old_str": "a = 1", "new_str": "a = 3"}'):
                "occurs 2 times in /workspace/pkg/mod.py (at lines 1, 3)",
            ("str_replace", '{"path": "pkg/mod.py", "old_str": "c = 3", "new_str": "c = 4"}'): "was not found",
            ("str_replace", '{"path": "pkg/mod.py", "old_str": "", "new_str": "x"}'): "old_str is empty",
            ("bash", '{"cmd": "ls"}'): "invalid arguments for bash: command: Field required",
            ("view", '{"path": "pkg", "view_range": [1, 2]}'): "is a directory; view_range only applies to files",
            ("create", '{"path": "/usr/orchard-test.txt", "content": "x"}'): "Read-only file system",
            ("edit", "{}"): "there is no tool 'edit'",
        }
        for (name, arguments), expected in cases.items():
            result = await tools.call(name, json.loads(arguments))
            assert result.is_error and result.content.startswith("Error:") and expected in result.content, result
        timed_out = await tools.call("bash", {"command": "echo started; sleep 10", "timeout": 1})
        assert "started" in timed_out.content and "timed out after 1 s" in timed_out.content
        merged = await tools.call("bash", {"command": "echo out; echo err >&2; exit 3"})
        assert merged.content == "[exit code 3]\nout\nerr\n"
        await sandbox.close()


async def test_registry_builds_react_with_options_and_rejects_bad_ones():
    harness = get_harness("react", step_limit=7, system_template="Work in $workdir.")
    assert isinstance(harness, ReActHarness) and harness.config.step_limit == 7
    with pytest.raises(InvalidRequest, match="unknown placeholder \\$repo"):
        ReActHarness(instance_template="Fix $repo")
    with pytest.raises(InvalidRequest, match="step_limit"):
        ReActHarness(step_limit=0)
    with pytest.raises(InvalidRequest, match="base_url"):
        await harness.run(swe_mini_task(TASK_ID), None, ModelConfig(model="policy"))
