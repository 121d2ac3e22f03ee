"""The ZeroClaw profile run by `orchard eval` with Orchard's scripted model (through the run's gateway) on small
script-graded tasks in real sandboxes: its prompt layout and tools, a delegated sub-agent, the history cap,
its step limit, and the mistakes a model makes (a tool it does not have, arguments that are not JSON)."""

from __future__ import annotations

import pytest
from zeroclaw_rig import orchard, results, scripted_model, task, trajectories, write_suite

from orchard.core.atif import to_atif
from orchard.core.chat import to_chat_messages
from orchard.testing.atif_spec import validate_atif
from orchard_zeroclaw.profile.history import BREADCRUMB
from orchard_zeroclaw.profile.schemas import main_tools, tool_names

pytestmark = pytest.mark.slow


def evaluate(tmp_path, script, tasks, *options: str):
    suite = write_suite(tmp_path / "suite", tasks)
    out = tmp_path / "out"
    with scripted_model(script, tmp_path) as base_url:
        ran = orchard("eval", "--harness", "zeroclaw", "--harness-option", "binary=", *options,
                      "--model", "openai/scripted", "--api-base", base_url, "--api-key", "none",
                      "--suite", str(suite), "--out", str(out), "--allow-errors", home=tmp_path / "home")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (trajectory,) = trajectories(out)
    (row,) = results(out)["tasks"]
    return trajectory, row


def call(call_id, name, **arguments):
    return {"id": call_id, "name": name, "arguments": arguments}


def own_agent_steps(trajectory):
    return [step for step in trajectory.steps if step.source == "agent" and not step.is_copied_context]


def test_a_run_with_a_delegated_sub_agent(tmp_path):
    script = [
        {"content": "", "tool_calls": [call("c1", "file_write", path="hello.txt", content="hello\n")]},
        {"content": "", "tool_calls": [call("c2", "delegate", agent="worker", prompt="Is hello.txt there?",
                                            context="I just wrote it.")]},
        {"content": "Checking.", "tool_calls": [call("s1", "shell", command="cat hello.txt")]},  # the sub-agent
        {"content": "Yes, it says hello."},
        {"content": "hello.txt is written."},
    ]
    trajectory, row = evaluate(tmp_path, script, [task("delegate", "Write hello into hello.txt.",
                                                       "grep -qx hello hello.txt")])
    assert (row["status"], trajectory.exit_status) == ("resolved", "submitted")
    assert trajectory.agent.version.endswith("+zeroclaw-profile.0.8.4")
    assert tool_names(trajectory.agent.tool_definitions) == tool_names(main_tools({"worker": ""}))
    system = trajectory.steps[0].message
    headings = ["## CRITICAL: No Tool Narration", "## CRITICAL: Tool Honesty", "## Tool Authorization",
                "## Your Task", "## Safety", "## Workspace", "## Project Context", "## Runtime"]
    assert [system.index(h) for h in headings] == sorted(system.index(h) for h in headings)
    assert "Working directory: `/workspace`" in system
    assert trajectory.steps[1].message == "Write hello into hello.txt."  # the task as ZeroClaw's one message

    steps = own_agent_steps(trajectory)
    assert all(step.llm_call_ids for step in steps)
    assert steps[0].observation.results[0].content == "Written 6 bytes to hello.txt"
    delegated = steps[1].observation.results[0]
    assert delegated.content == "[Agent 'worker' (custom/openai/scripted, agentic)]\nYes, it says hello."
    (sub,) = trajectory.subagent_trajectories
    assert delegated.subagent_trajectory_ref[0].trajectory_id == sub.trajectory_id == "delegate-c2"
    assert sub.agent.name == "zeroclaw/worker" and "delegate" not in tool_names(sub.agent.tool_definitions)
    assert sub.steps[0].message.startswith("## Role\n\nYou are the sub-agent `worker`")
    assert sub.steps[1].message == "I just wrote it.\n\nIs hello.txt there?"
    sub_steps = own_agent_steps(sub)
    assert [s.message for s in sub_steps] == ["Checking.", "Yes, it says hello."]
    assert sub_steps[0].observation.results[0].content == "hello\n"
    assert all(s.extra.get("response_id") for s in sub_steps) and sub.exit_status == "submitted"
    validate_atif(to_atif(trajectory))


def test_the_history_cap_cuts_the_middle_and_repeats_the_kept_context_as_copies(tmp_path):
    script = [{"content": f"Step {n}.", "tool_calls": [call(f"c{n}", "shell", command=f"echo {n} >> log.txt")]}
              for n in range(1, 6)] + [{"content": "Five lines written."}]
    trajectory, row = evaluate(tmp_path, script, [task("cap", "Append 1 to 5 to log.txt.",
                                                       "test $(wc -l < log.txt) = 5")],
                               "--harness-option", "max_history_messages=6")
    assert (row["status"], trajectory.exit_status) == ("resolved", "submitted")
    crumbs = [step for step in trajectory.steps if step.extra.get("zeroclaw_history_trimmed")]
    assert crumbs and all(step.message == BREADCRUMB and not step.is_copied_context for step in crumbs)
    assert crumbs[0].extra["zeroclaw_history_trimmed"] == {"type": "history_trimmed", "dropped_messages": 4,
                                                           "kept_turns": 1, "reason": "message limit"}
    copied = [step for step in trajectory.steps if step.is_copied_context]
    assert {step.source for step in copied} == {"user", "agent"}
    assert copied[0].message == "Append 1 to 5 to log.txt."  # the anchor comes first again
    steps = own_agent_steps(trajectory)
    assert [s.message for s in steps] == [f"Step {n}." for n in range(1, 6)] + ["Five lines written."]
    assert all(step.llm_call_ids for step in steps)
    said = [m["content"] for m in to_chat_messages(trajectory) if m["role"] == "assistant"]
    assert said == [s.message for s in steps]  # the copies are left out of what is trained on
    validate_atif(to_atif(trajectory))


def test_the_step_limit_and_the_mistakes_a_model_makes(tmp_path):
    script = [
        {"content": "", "tool_calls": [call("c1", "apply_patch", patch="...")]},
        {"content": "", "tool_calls": [{"id": "c2", "name": "shell", "arguments": "{\"command\": \"ls"}]},
        {"content": "", "tool_calls": [call("c3", "shell", command="touch a.txt")]},
        {"content": "never asked for"},
    ]
    trajectory, row = evaluate(tmp_path, script, [task("limit", "Make a.txt.", "test -e a.txt")], "--max-steps", "3")
    assert (row["status"], trajectory.exit_status) == ("resolved", "step_limit")
    assert "the step limit of 3 model calls" in trajectory.notes
    first, second, third = own_agent_steps(trajectory)
    assert first.observation.results[0].content == "Error: Unknown tool: apply_patch"
    malformed = second.tool_calls[0]
    assert malformed.raw_arguments == "{\"command\": \"ls" and not malformed.arguments_valid
    assert second.observation.results[0].content.startswith("Error executing shell: the arguments are not valid JSON")
    assert third.observation.results[0].content == "(no output)"


def test_options_the_profile_does_not_take_are_refused_before_anything_runs(tmp_path):
    suite = write_suite(tmp_path / "suite", [task("t", "Say hi.", "true")])
    for option, words in (("approval=deny", "the ZeroClaw profile does not take approval"),
                          ("max_history_messages=1", "max_history_messages"),
                          ("no_such_option=1", "no_such_option")):
        ran = orchard("eval", "--harness", "zeroclaw", "--harness-option", "binary=", "--harness-option", option,
                      "--model", "oracle", "--suite", str(suite), "--out", str(tmp_path / "out"),
                      home=tmp_path / "home")
        assert ran.returncode != 0 and words in ran.stdout + ran.stderr, ran.stdout + ran.stderr
