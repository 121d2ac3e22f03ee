"""The real-binary path's pieces that need no sandbox: the frames and relay records read into a trajectory
(frames made up here in the shapes ZeroClaw 0.8.4's gateway sends, crates/zeroclaw-gateway/src/ws.rs), how a
run's ending is classified, ZeroClaw's config.toml, and the options the real binary takes."""

from __future__ import annotations

import json
import tomllib

import pytest
from pydantic import SecretStr
from zeroclaw_rig import STANDIN

from orchard.core.errors import InvalidRequest
from orchard.core.harness import ModelConfig, get_harness
from orchard.core.sandbox import ExecResult
from orchard.core.task import Task
from orchard.core.trajectory import Agent
from orchard.harnesses.in_sandbox import Finished
from orchard_zeroclaw.real.config import config_toml
from orchard_zeroclaw.real.frames import ZeroClawLog, trajectory_from_log
from orchard_zeroclaw.real.harness import RealZeroClaw

AGENT = Agent(name="zeroclaw", version="v", model_name="m")


def inbound(*frames):
    return [{"seq": n, "dir": "in", "frame": frame} if isinstance(frame, dict) else {"seq": n, "dir": "in",
                                                                                  "raw": frame}
            for n, frame in enumerate(frames, start=1)]


def call(seq, messages, reply, *, extends=False, conversation="main", tools=None):
    record = {"seq": seq, "done": seq, "conversation": conversation, "extends": extends, "messages": messages,
              "status": 200, "response_id": f"resp-{seq}", "usage": {"prompt_tokens": 10, "completion_tokens": 2},
              "message": reply}
    if not extends:
        record["tools"] = tools or []
    return record


SYSTEM = {"role": "system", "content": "sys"}
TASK = {"role": "user", "content": "do it"}
SHELL_CALL = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\": \"ls\"}"}}


def test_frames_become_steps_linked_to_the_calls_and_nothing_is_dropped():
    frames = inbound(
        {"type": "session_start", "session_id": "s-1", "resumed": False, "message_count": 0},
        {"type": "thinking", "content": "hmm"},
        {"type": "chunk", "content": "Listing."},
        {"type": "tool_call", "id": "c1", "name": "shell", "args": {"command": "ls"}},
        {"type": "approval_request", "request_id": "r1", "tool": "shell", "arguments_summary": "ls",
         "timeout_secs": 120},
        {"type": "plan", "entries": [{"content": "list", "status": "pending"}]},
        {"type": "tool_result", "id": "c1", "name": "shell", "output": "a.txt\n"},
        {"type": "tool_result", "id": "ghost", "name": "shell", "output": "?"},
        {"type": "mood", "value": "sunny"},
        "<not json>",
        {"type": "chunk", "content": "Done."},
        {"type": "done", "full_response": "Done.", "input_tokens": 20, "output_tokens": 4})
    frames.insert(5, {"seq": 99, "dir": "out", "frame": {"type": "approval_response", "request_id": "r1",
                                                          "decision": "always"}})
    calls = [call(1, [SYSTEM, TASK], {"content": "Listing.", "reasoning_content": "hmm", "tool_calls": [
                 {"id": "c1", "name": "shell", "arguments": "{\"command\":\"ls\"}"}]},
                  tools=[{"type": "function", "function": {"name": "shell"}}]),
             call(2, [{"role": "assistant", "content": "Listing.", "tool_calls": [SHELL_CALL]},
                      {"role": "tool", "tool_call_id": "c1", "content": "a.txt\n"}],
                  {"content": "Done."}, extends=True),
             call(3, [{"role": "system", "content": "consolidate"}], {"content": "{}"}, conversation="memory")]
    trajectory = trajectory_from_log(ZeroClawLog("/s", frames=frames, calls=calls), AGENT, "do it")
    assert [(s.source, s.message) for s in trajectory.steps] == [("system", "sys"), ("user", "do it"),
                                                                 ("agent", "Listing."), ("agent", "Done.")]
    listing, done = trajectory.steps[2:]
    assert listing.reasoning_content == "hmm" and listing.extra["response_id"] == "resp-1"
    assert listing.tool_calls[0].raw_arguments == "{\"command\":\"ls\"}"  # as the model wrote it
    assert listing.observation.results[0].content == "a.txt\n" and done.extra["response_id"] == "resp-2"
    assert trajectory.exit_status == "submitted" and trajectory.session_id == "s-1"
    assert trajectory.agent.tool_definitions == [{"type": "function", "function": {"name": "shell"}}]
    extra = trajectory.extra
    assert extra["zeroclaw_approvals"] == [{"frame": frames[4]["frame"], "step_id": 3, "decision": "always"}]
    assert extra["zeroclaw_plans"][0]["entries"][0]["content"] == "list"
    assert extra["zeroclaw_unknown_frames"] == [{"seq": 9, "frame": {"type": "mood", "value": "sunny"}},
                                                {"seq": 10, "raw": "<not json>"}]
    assert extra["zeroclaw_unpaired_results"] == [{"type": "tool_result", "id": "ghost", "name": "shell",
                                                   "output": "?"}]
    assert extra["zeroclaw_other_calls"][0]["conversation"] == "memory"
    assert extra["zeroclaw_done"]["input_tokens"] == 20


def test_after_a_cut_the_context_zeroclaw_resends_is_copied_and_its_breadcrumb_is_new():
    answer = {"role": "assistant", "content": "Listing.", "tool_calls": [SHELL_CALL]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "a.txt\n"}
    crumb = {"role": "user", "content": "[earlier turns omitted to fit the context window]"}
    frames = inbound({"type": "chunk", "content": "Listing."},
                     {"type": "tool_call", "id": "c1", "name": "shell", "args": {"command": "ls"}},
                     {"type": "tool_result", "id": "c1", "name": "shell", "output": "a.txt\n"},
                     {"type": "history_trimmed", "dropped_messages": 2, "kept_turns": 1, "reason": "message limit"},
                     {"type": "done", "full_response": "Done."})
    calls = [call(1, [SYSTEM, TASK], {"content": "Listing.", "tool_calls": [
                 {"id": "c1", "name": "shell", "arguments": "{\"command\": \"ls\"}"}]}),
             call(2, [SYSTEM, TASK, crumb, answer, result], {"content": "Done."})]
    trajectory = trajectory_from_log(ZeroClawLog("/s", frames=frames, calls=calls), AGENT, "do it")
    shown = [(s.source, s.message, s.is_copied_context) for s in trajectory.steps]
    assert shown == [("system", "sys", False), ("user", "do it", False), ("agent", "Listing.", False),
                     ("user", "do it", True), ("user", crumb["content"], False), ("agent", "Listing.", True),
                     ("agent", "Done.", False)]
    assert trajectory.steps[4].extra["zeroclaw_history_trimmed"]["dropped_messages"] == 2
    assert trajectory.steps[5].observation.results[0].content == "a.txt\n"
    assert trajectory.steps[6].extra["response_id"] == "resp-2"


def test_a_run_that_never_reached_the_model_still_has_its_task():
    frames = [{"seq": 1, "dir": "out", "frame": {"type": "message", "content": "the task as sent"}}]
    trajectory = trajectory_from_log(ZeroClawLog("/s", frames=frames), AGENT, "the task")
    assert [(s.source, s.message) for s in trajectory.steps] == [("user", "the task as sent")]
    assert trajectory.exit_status is None


def ending(log: ZeroClawLog, **result):
    harness = RealZeroClaw(binary=str(STANDIN))
    finished = Finished(result=ExecResult(exit_code=result.pop("exit_code", 0), stdout="",
                                          stderr=result.pop("stderr", ""), timed_out=result.pop("timed_out", False)))
    return harness.ending(None, finished, log, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("result, calls, status, words", [
    ({"ending": "done"}, [], "submitted", None),
    ({"ending": "error", "code": "AGENT_ERROR", "error": "Agent exceeded maximum tool iterations (3)"}, [],
     "step_limit", None),
    ({"ending": "error", "code": "PROVIDER_ERROR", "error": "model provider error"},
     [{"seq": 1, "done": 1, "error": "502 upstream failed"}], "model_error", "502 upstream failed"),
    ({"ending": "error", "code": "PROVIDER_ERROR", "error": "x"},
     [{"seq": 1, "done": 1, "error": "{\"error\": \"budget_exceeded\"}"}], "budget_exhausted", None),
    ({"ending": "aborted"}, [], "agent_error", "aborted the turn"),
    ({"ending": "closed", "gateway_log_tail": "panic: boom"}, [], "agent_error", "its log ends: panic: boom"),
    ({"ending": "start_failed", "error": "ZeroClaw's gateway exited with code 2 before it answered /health",
      "gateway_exit": 2}, [], "agent_error", "did not start: ZeroClaw's gateway exited with code 2"),
    ({"ending": "timeout"}, [], "timeout", "ran past its time limit"),
])
def test_how_a_run_ended(result, calls, status, words):
    end = ending(ZeroClawLog("/s", calls=calls, result=result))
    assert end.exit_status == status
    if words is None:
        assert end.error is None
    else:
        assert words in end.error


def test_a_driver_that_left_no_result_is_an_error_with_its_stderr():
    end = ending(ZeroClawLog("/s"), exit_code=1, stderr="Traceback ...\nKeyError: 'config'")
    assert end.exit_status == "agent_error" and "without its result" in end.error and "KeyError" in end.error
    assert ending(ZeroClawLog("/s"), timed_out=True, exit_code=None).exit_status == "timeout"


def test_the_config_points_zeroclaw_at_the_gateway_through_the_relay_with_the_tasks_mcp_servers():
    model = ModelConfig(model="policy", base_url="http://127.0.0.1:4000/r/run:t:1/v1", api_key=SecretStr("k-1"))
    task = Task.model_validate({"id": "t", "instruction": "i", "environment": {"workdir": "/testbed", "mcp_servers": [
        {"name": "notes", "command": "python3 notes.py http 8040", "port": 8040},
        {"name": "loud", "command": "python3 notes.py stdio", "transport": "stdio", "env": {"LOUD": "1"}}]}})
    text = config_toml(model, task, step_limit=7, max_history_messages=20, shell_timeout_s=30, autonomy="supervised")
    config = tomllib.loads(text.replace("@RELAY_PORT@", "5555"))
    provider = config["providers"]["models"]["custom"]["orchard"]
    assert provider == {"uri": "http://127.0.0.1:5555/r/run:t:1/v1", "api_key": "k-1", "model": "policy",
                        "native_tools": True, "wire_api": "chat_completions"}
    assert config["agents"]["orchard"] == {"model_provider": "custom.orchard", "risk_profile": "orchard",
                                           "runtime_profile": "orchard"}
    assert config["risk_profiles"]["orchard"]["level"] == "supervised"
    assert config["risk_profiles"]["orchard"]["allowed_roots"] == ["/testbed"]
    runtime = config["runtime_profiles"]["orchard"]
    limits = [runtime[key] for key in ("max_tool_iterations", "max_history_messages", "shell_timeout_secs")]
    assert limits == [7, 20, 30]
    assert config["gateway"] == {"host": "127.0.0.1", "require_pairing": False, "session_persistence": False}
    assert config["mcp"]["servers"] == [
        {"name": "notes", "transport": "http", "url": "http://127.0.0.1:8040/mcp"},
        {"name": "loud", "transport": "stdio", "command": "/bin/sh", "args": ["-c", "python3 notes.py stdio"],
         "env": {"LOUD": "1"}}]


def test_the_real_binarys_options(monkeypatch):
    harness = get_harness("zeroclaw", binary=str(STANDIN), approval="always", step_limit=9)
    assert harness.runs_real_binary and harness.bundle == "zeroclaw" and "+zeroclaw.bin." in harness.version
    monkeypatch.setenv("ZEROCLAW_BIN", str(STANDIN))
    assert get_harness("zeroclaw").runs_real_binary and not get_harness("zeroclaw", binary="").runs_real_binary
    for options, words in (({"approval": "maybe"}, "approval must be one of approve, always, deny"),
                           ({"delegate_step_limit": 3}, r"does not take the profile's option\(s\) delegate_step_limit"),
                           ({"bundle": "no-such-bundle", "binary": ""}, "no-such-bundle")):
        with pytest.raises(InvalidRequest, match=words):
            get_harness("zeroclaw", **options)
    assert json.loads(json.dumps(harness.version))  # a plain string, as the resume key keeps it
