"""The real-binary path (`binary=PATH`: the driver in the task's sandbox, the relay, the frames read back) run by
`orchard eval` against the STAND-IN for the ZeroClaw binary (zeroclaw_standin.py). ZeroClaw itself cannot be
built or fetched on these machines; the stand-in speaks its gateway's documented frames, so these tests check
the adapter's side of them, not ZeroClaw. The model is Orchard's scripted server, through the run's gateway.

- a full turn: an approval asked and answered by the policy, a shell command, a delegated sub-agent (its steps
  in `subagent_trajectories`, referenced from the delegate's result), the final reply; every step linked to
  the gateway's record of its call, the model's own argument text kept, valid ATIF; the background process the
  agent left was stopped by the driver, and nothing of the run still runs on this machine;
- the `deny` policy: the command is not run and the trajectory says so;
- a history cut (`history_trimmed`): the kept context repeated as copied steps, the breadcrumb a new user step;
  a frame ZeroClaw does not have and a frame that is not JSON, kept raw in the trajectory's extra;
- bad input: a binary that crashes, a gateway that closes the chat before `done`, a binary that is not there:
  clear errors, nothing left running."""

from __future__ import annotations

import json

import pytest
from zeroclaw_rig import (STANDIN, home_with_cache, host_processes, orchard, results, scripted_model, task,
                          trajectories, write_suite)

from orchard.core.atif import to_atif
from orchard.core.chat import to_chat_messages
from orchard.testing.atif_spec import validate_atif

pytestmark = pytest.mark.slow
MARKER = "sleep 3217"  # the background process a command leaves behind


@pytest.fixture(scope="module")
def home(tmp_path_factory, zeroclaw_cache):
    return home_with_cache(tmp_path_factory.mktemp("standin-home"), zeroclaw_cache)


def evaluate(home, tmp_path, script, tasks, *options: str):
    """`orchard eval --harness zeroclaw --harness-option binary=STANDIN ...` with the scripted model."""
    suite = write_suite(tmp_path / "suite", tasks)
    out = tmp_path / "out"
    with scripted_model(script, tmp_path) as base_url:
        ran = orchard("eval", "--harness", "zeroclaw", "--harness-option", f"binary={STANDIN}", *options,
                      "--model", "openai/scripted", "--api-base", base_url, "--api-key", "none",
                      "--suite", str(suite), "--out", str(out), "--allow-errors", home=home)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (trajectory,) = trajectories(out)
    (row,) = results(out)["tasks"]
    assert not host_processes(MARKER) and not host_processes(str(STANDIN.name)), "something of the run still runs"
    return trajectory, row


def call(call_id, name, **arguments):
    return {"id": call_id, "name": name, "arguments": arguments}


def own_agent_steps(trajectory):
    return [step for step in trajectory.steps if step.source == "agent" and not step.is_copied_context]


def test_a_full_turn_with_an_approval_and_a_delegated_sub_agent(home, tmp_path):
    script = [
        {"content": "Writing the file.", "tool_calls": [call(
            "c1", "shell", command=f"echo hello > hello.txt; ({MARKER} > /dev/null 2>&1 &)")]},
        {"content": "", "tool_calls": [call("c2", "delegate", agent="worker", prompt="Check that hello.txt exists.")]},
        {"content": "Looking.", "tool_calls": [call("s1", "shell", command="ls")]},  # the sub-agent
        {"content": "hello.txt is there."},  # the sub-agent's answer
        {"content": "Done: hello.txt holds hello."},
    ]
    trajectory, row = evaluate(home, tmp_path, script, [task("full", "Write hello into hello.txt.",
                                                             "grep -qx hello hello.txt")],
                               "--harness-option", "autonomy=supervised", "--harness-option", "approval=approve")
    assert (row["status"], trajectory.exit_status) == ("resolved", "submitted"), row
    assert "stand-in" in trajectory.agent.extra["zeroclaw_version"] and "+zeroclaw.bin." in trajectory.agent.version

    steps = own_agent_steps(trajectory)
    assert [[c.function_name for c in step.tool_calls] for step in steps] == [["shell"], ["delegate"], []]
    assert all(step.llm_call_ids for step in steps), "every step names the gateway's record of its call"
    assert {i for step in steps for i in step.llm_call_ids} <= {c.id for c in trajectory.llm_calls}
    first = steps[0].tool_calls[0]
    assert first.raw_arguments == json.dumps(script[0]["tool_calls"][0]["arguments"])  # as the model wrote it
    assert steps[-1].message == "Done: hello.txt holds hello."
    assert trajectory.steps[0].source == "system" and trajectory.steps[1].message == "Write hello into hello.txt."

    (approval,) = trajectory.extra["zeroclaw_approvals"]
    assert approval["frame"]["tool"] == "shell" and approval["decision"] == "approve"

    (sub,) = trajectory.subagent_trajectories
    assert (sub.trajectory_id, sub.agent.name) == ("c2", "zeroclaw/delegate")
    sub_steps = own_agent_steps(sub)
    assert [s.message for s in sub_steps] == ["Looking.", "hello.txt is there."]
    assert all(s.extra.get("response_id") for s in sub_steps)
    assert "hello.txt" in sub_steps[0].observation.results[0].content
    delegated = steps[1].observation.results[0]
    assert delegated.subagent_trajectory_ref[0].trajectory_id == "c2"
    assert delegated.content.startswith("[Agent 'worker'") and "hello.txt is there." in delegated.content

    ended = trajectory.extra["zeroclaw_result"]
    assert any(MARKER in command for command in ended["stopped"]) and ended["left_running"] == []
    validate_atif(to_atif(trajectory))


def test_the_deny_policy_keeps_the_command_from_running(home, tmp_path):
    script = [{"content": "", "tool_calls": [call("c1", "shell", command="echo hello > hello.txt")]},
              {"content": "I was not allowed to write it."}]
    trajectory, row = evaluate(home, tmp_path, script, [task("deny", "Write hello into hello.txt.",
                                                             "grep -qx hello hello.txt")],
                               "--harness-option", "autonomy=supervised", "--harness-option", "approval=deny")
    assert (row["status"], trajectory.exit_status) == ("failed", "submitted")
    (approval,) = trajectory.extra["zeroclaw_approvals"]
    assert approval["decision"] == "deny"
    result = own_agent_steps(trajectory)[0].observation.results[0]
    assert result.content.startswith("Error:") and "denied" in result.content and result.extra["is_error"]


def test_a_history_cut_and_frames_zeroclaw_does_not_have(home, tmp_path):
    script = [{"content": f"Step {n}.", "tool_calls": [call(f"c{n}", "shell", command=f"echo {n} >> log.txt")]}
              for n in (1, 2, 3)] + [{"content": "All three written."}]
    trajectory, row = evaluate(
        home, tmp_path, script, [task("trim", "Append 1, 2 and 3 to log.txt.", "test \"$(cat log.txt)\" = "
                                      "\"$(printf '1\\n2\\n3')\"", env={"ZEROCLAW_STANDIN": "odd-frames"})],
        "--harness-option", "max_history_messages=4")
    assert (row["status"], trajectory.exit_status) == ("resolved", "submitted")
    assert len(trajectory.extra["zeroclaw_history_trimmed"]) == 2
    assert all(frame["reason"] == "message limit" for frame in trajectory.extra["zeroclaw_history_trimmed"])
    copied = [step for step in trajectory.steps if step.is_copied_context]
    assert copied and any(step.source == "agent" for step in copied)
    crumb = next(step for step in trajectory.steps if step.extra.get("zeroclaw_history_trimmed"))
    assert crumb.source == "user" and not crumb.is_copied_context and "omitted" in crumb.message
    steps = own_agent_steps(trajectory)
    assert [s.message for s in steps] == ["Step 1.", "Step 2.", "Step 3.", "All three written."]
    assert all(step.llm_call_ids for step in steps)
    assert [m["content"] for m in to_chat_messages(trajectory) if m["role"] == "assistant"] == [
        s.message for s in steps]  # the copies are left out of what is trained on

    unknown = trajectory.extra["zeroclaw_unknown_frames"]
    assert {"frame": {"type": "weather_report", "sky": "clear", "note": "not a ZeroClaw frame"}} in [
        {"frame": u["frame"]} for u in unknown if "frame" in u]
    assert "this frame is not JSON" in [u.get("raw") for u in unknown]
    assert len(unknown) == 6  # three of each, none dropped
    validate_atif(to_atif(trajectory))


@pytest.mark.parametrize("flag, expected", [
    ("crash", ["zeroclaw did not start", "exited with code 3 before it answered /health", "crashing on purpose"]),
    ("close-early", ["closed the chat before the turn ended"]),
])
def test_a_gateway_that_fails_is_an_error_that_says_why(home, tmp_path, flag, expected):
    script = [{"content": "", "tool_calls": [call("c1", "shell", command="echo hello > hello.txt")]},
              {"content": "Done."}]
    trajectory, row = evaluate(home, tmp_path, script, [task(flag, "Write hello into hello.txt.", "true",
                                                             env={"ZEROCLAW_STANDIN": flag})])
    assert (row["status"], trajectory.exit_status) == ("error", "agent_error")
    for words in expected:
        assert words in trajectory.outcome.error, trajectory.outcome.error
    assert trajectory.extra["zeroclaw_result"]["left_running"] == []


def test_a_binary_that_is_not_there_is_refused_before_anything_runs(tmp_path):
    suite = write_suite(tmp_path / "suite", [task("t", "Say hi.", "true")])
    ran = orchard("eval", "--harness", "zeroclaw", "--harness-option", f"binary={tmp_path / 'no-zeroclaw'}",
                  "--model", "oracle", "--suite", str(suite), "--out", str(tmp_path / "out"), home=tmp_path / "home")
    assert ran.returncode != 0
    assert f"the ZeroClaw binary {tmp_path / 'no-zeroclaw'} (binary option or $ZEROCLAW_BIN) is not a file" in (
        ran.stdout + ran.stderr)
    assert not (tmp_path / "out" / "trajectories.jsonl").exists()
