"""The `kimi-cli` harness with the real Kimi-CLI 1.51.0 from its harness bundle (built once per session, the
downloads shared) in real embedded sandboxes, through the real evaluator and its gateway: driven by the oracle
(three swe-mini tasks at once, ORACLE_SAMPLE: their patches hold every awkward character) and by the scripted
model server (a subagent and a compaction, a run killed mid-command, a crash, failed model calls). Each
trajectory is checked against the gateway's records (no step invented) and exported to ATIF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hang_guard import returns
from orchard.eval.run_config import TrialTimeouts
from orchard.core.atif import to_atif
from orchard.core.trajectory import Agent, Trajectory
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.gateway.config import GatewayConfig
from orchard.harnesses.kimi_cli.convert import KimiLog, parse_jsonl, trajectory_from_log
from tests.atif_spec import validate_atif
from tests.harness_rig import ORACLE_SAMPLE, SCRIPTED, scripted_config
from tests.in_sandbox_harness_rig import (check_step_is_reply, home_fixtures, k8s_run, replies_by_id, run_trajectories,
                                          unreachable_model)

pytestmark = pytest.mark.slow
TASK = "orchard__pagekit-112"


bundle_home, home = home_fixtures("kimi-cli")  # the bundle built once per session (~30 s; downloads kept)


def check_fidelity(trajectory: Trajectory) -> None:
    """Every agent step Kimi took (not a copy a compaction repeated), its subagents' too, is one gateway call's
    reply, found by the response id Kimi logged: same text, same tool calls; the whole exports to valid ATIF."""
    by_response = replies_by_id(trajectory)
    for step in _own_agent_steps(trajectory):
        call = by_response[step.extra["response_id"]]
        if step in trajectory.steps:  # the evaluator links the main agent's steps to their calls
            assert step.llm_call_ids == [call.id]
        check_step_is_reply(step, call)
    validate_atif(to_atif(trajectory))


def _own_agent_steps(trajectory: Trajectory):
    for sub in [trajectory, *trajectory.subagent_trajectories]:
        for step in sub.steps:
            if step.source == "agent" and not step.is_copied_context:
                yield step


async def test_the_oracle_resolves_swe_mini_through_kimis_own_shell_tool(home, tmp_path):
    out = tmp_path / "oracle"
    results = await run_eval(harness="kimi-cli", model="oracle", suite="swe-mini", task_ids=ORACLE_SAMPLE,
                             out_dir=out, parallel=len(ORACLE_SAMPLE), gateway_config=GatewayConfig(), backend="local")
    assert [row.status for row in results.tasks] == ["resolved"] * len(ORACLE_SAMPLE), [r.error for r in results.tasks]
    assert sorted(row.task_id for row in results.tasks) == sorted(ORACLE_SAMPLE)
    for trajectory in run_trajectories(out):
        assert trajectory.exit_status == "submitted"
        assert [c.function_name for s in trajectory.steps for c in s.tool_calls] == ["Shell"] * 3
        check_fidelity(trajectory)
        assert len(list(_own_agent_steps(trajectory))) == len(trajectory.llm_calls) == 4
        kept = trajectory.extra["native_logs"]
        assert {Path(p).name for p in kept.values()} >= {"kimi.log"}
        session = next(out / p for p in kept.values() if not p.endswith("kimi.log"))
        assert (session / "wire.jsonl").is_file() and (session / "context.jsonl").is_file()


BIG = "yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 40000"  # 40 kB of output: the context grows
SUBAGENT_REPLY = ("The repository holds the pagekit package: pagekit/__init__.py and pagekit/paginator.py, which "
                  "defines Page and paginate; tests live under tests/. Nothing else is there, and no file looks "
                  "generated or out of place.")  # Kimi asks a subagent again when its answer is under 200 chars


async def test_a_subagent_and_a_compaction_from_the_scripted_model(home, tmp_path, scripted):
    """First a plain reply (Kimi ends its turn: submitted), which also measures the size of Kimi's first prompt;
    then a run whose context is set to overflow at its third step: a Shell call with a big output, an Agent call
    whose subagent runs Shell itself, the compaction's own model call, the last reply."""
    scripted.load([{"content": "Nothing to do."}])
    out = tmp_path / "plain"
    await run_eval(harness="kimi-cli", model=SCRIPTED, suite="swe-mini", task_ids=[TASK], out_dir=out,
                   gateway_config=scripted_config(scripted), backend="local")
    (plain,) = run_trajectories(out)
    assert plain.exit_status == "submitted" and plain.outcome.error is None
    assert [s.source for s in plain.steps] == ["system", "user", "user", "agent"]  # prompt, task, afk note, reply
    task = next(task for task in load_suite("swe-mini").tasks if task.id == TASK)
    assert plain.steps[1].message == task.instruction.strip()  # given on stdin, whole
    check_fidelity(plain)
    first_prompt = plain.llm_calls[0].prompt_tokens
    # Kimi compacts before a step once its context + 50k reserved tokens reach max_context_size: not before the
    # second step (first prompt + ~10k estimated), but before the third (+40k of output reported by the server)
    scripted.load([
        {"content": "Make the context big.", "tool_calls": [{"id": "call_big", "name": "Shell",
                                                             "arguments": {"command": BIG}}]},
        {"content": "Ask a helper.", "tool_calls": [{"id": "call_agent", "name": "Agent", "arguments": {
            "description": "list the files", "prompt": "List the files in the repository.",
            "subagent_type": "coder"}}]},
        {"content": "Listing.", "tool_calls": [{"id": "call_sub_ls", "name": "Shell", "arguments": {"command": "ls"}}]},
        {"content": SUBAGENT_REPLY},
        {"content": "SUMMARY: a big output was read; the helper listed the files."},
        {"content": "All done."}])
    out = tmp_path / "compacted"
    results = await run_eval(harness="kimi-cli", model=SCRIPTED, suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=scripted_config(scripted), backend="local",
                             harness_options={"max_context_size": first_prompt + 75_000})
    (trajectory,) = run_trajectories(out)
    assert (results.tasks[0].status, trajectory.exit_status) == ("failed", "submitted")  # nothing was fixed
    assert trajectory.extra["kimi_compactions"] == 1
    check_fidelity(trajectory)
    agent = [(s.message, s.is_copied_context) for s in trajectory.steps if s.source == "agent"]
    assert agent == [("Make the context big.", False), ("Ask a helper.", False),
                     ("Make the context big.", True), ("Ask a helper.", True), ("All done.", False)]
    summary = next(s for s in trajectory.steps if s.extra.get("kimi_compaction_summary"))
    assert "SUMMARY: a big output was read" in summary.message and not summary.is_copied_context
    (sub,) = trajectory.subagent_trajectories
    assert [s.message for s in sub.steps if s.source == "agent"] == ["Listing.", SUBAGENT_REPLY]
    assert sub.extra["parent_tool_call_id"] == "call_agent"
    assert [c.function_name for s in sub.steps for c in s.tool_calls] == ["Shell"]
    ask = next(s for s in trajectory.steps if s.message == "Ask a helper." and not s.is_copied_context)
    (result,) = ask.observation.results
    assert [ref.session_id for ref in result.subagent_trajectory_ref] == [sub.session_id]
    # six model calls: four agent steps linked (main and subagent), the compaction's call, the last reply
    linked = {s.extra["response_id"] for s in _own_agent_steps(trajectory)}
    assert len(trajectory.llm_calls) == 6 and len(linked) == 5
    (unlinked,) = [c for c in trajectory.llm_calls if c.response["id"] not in linked]
    assert "SUMMARY" in unlinked.response["choices"][0]["message"]["content"]


async def test_failures_are_errors_with_kimis_own_words(home, tmp_path, scripted):
    """Killed mid-command at its time limit (the steps so far kept), a crash (a config Kimi refuses), model
    calls that fail (the gateway's route leads nowhere): each an error, not a failed attempt."""
    scripted.load([{"content": "Wait.", "tool_calls": [{"id": "call_sleep", "name": "Shell",
                                                        "arguments": {"command": "sleep 600", "timeout": 300}}]}],
                  loop=True)
    out = tmp_path / "killed"
    results = await returns(run_eval(harness="kimi-cli", model=SCRIPTED, suite="swe-mini", task_ids=[TASK],
                                     out_dir=out, gateway_config=scripted_config(scripted), backend="local",
                                     timeouts=TrialTimeouts(agent_s=35)), "a run whose agent hangs in a command",
                            within_s=300)
    (row,) = results.tasks
    (killed,) = run_trajectories(out)
    assert row.status == "error" and killed.exit_status == "timeout" and killed.partial, (row, killed.outcome)
    assert "killed with its process group" in killed.outcome.error
    # the reply whose command was running is in the wire log only (Kimi writes it to its context afterwards)
    last = killed.steps[-1]
    assert [c.function_name for c in last.tool_calls] == ["Shell"] and last.extra["kimi_from_wire"]
    assert last.llm_call_ids == [killed.llm_calls[0].id] and last.observation is None
    validate_atif(to_atif(killed))

    out = tmp_path / "crash"
    results = await run_eval(harness="kimi-cli", model=SCRIPTED, suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=scripted_config(scripted), backend="local",
                             harness_options={"step_limit": 0})  # Kimi refuses max_steps_per_turn = 0
    (row,) = results.tasks
    assert row.status == "error" and "exited with code 1" in row.error, row.error

    out = tmp_path / "down"
    results = await run_eval(harness="kimi-cli", model="down", suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=unreachable_model("down"), backend="local")
    (row,) = results.tasks
    (failed,) = run_trajectories(out)
    assert row.status == "error" and failed.exit_status == "model_error", row.error
    assert "model calls failed" in failed.outcome.error


def test_a_truncated_wire_log_is_read_as_far_as_it_goes(tmp_path):
    """A wire.jsonl cut mid-line (Kimi killed while writing): the events before the cut are read, the steps
    after them lose only their response ids; nothing is invented."""
    context = [
        {"role": "_system_prompt", "content": "You are Kimi."}, {"role": "_checkpoint", "id": 0},
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": "Look.", "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "Shell", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "content": [{"type": "text", "text": "a.py\n"}], "tool_call_id": "c1"},
        {"role": "assistant", "content": [{"type": "think", "think": "Hmm."}, {"type": "text", "text": "Done."}]}]
    wire = [{"type": "metadata", "protocol_version": "1.10"},
            {"timestamp": 1.0, "message": {"type": "StatusUpdate", "payload": {"message_id": "resp-1"}}},
            {"timestamp": 2.0, "message": {"type": "StatusUpdate", "payload": {"message_id": "resp-2"}}}]
    data = "".join(json.dumps(record) + "\n" for record in wire).encode()
    cut = data[:data.rindex(b"resp-2")]  # the second StatusUpdate cut short
    log = KimiLog(directory="/s", contexts=[context], wire=parse_jsonl(cut))
    trajectory = trajectory_from_log(log, Agent(name="kimi-cli", version="1.51.0"))
    steps = [(s.source, s.message, s.extra.get("response_id")) for s in trajectory.steps]
    assert steps == [("system", "You are Kimi.", None), ("user", "Fix it.", None), ("agent", "Look.", "resp-1"),
                     ("agent", "Done.", None)]
    assert trajectory.steps[2].observation.results[0].content == "a.py\n"
    assert trajectory.steps[3].reasoning_content == "Hmm."
    assert trajectory.exit_status is None  # no TurnEnd in what was read
    validate_atif(to_atif(trajectory))


@pytest.mark.k8s
async def test_on_kubernetes_three_tasks_in_pods(home, tmp_path, monkeypatch, scripted):
    """The same harness in Pods of the dev cluster, on a busybox image with no Python (Kimi's Shell falls back to
    its /bin/sh): the bundle copied from its injector image, the run's gateway at the node's address, one
    rollout at a time so each gets the script from its start."""
    from orchard.core.task import ScriptGrader, Task, TaskEnvironment
    from orchard.core.task_suite import TaskSuite
    from tests.k8s_cluster import NODE_IP

    with k8s_run(home, "kimi-cli") as config:
        monkeypatch.setenv("ORCHARD_GATEWAY_HOST", NODE_IP)
        scripted.load([{"content": "Write it.", "tool_calls": [{"name": "Shell", "arguments": {
            "command": "echo hello > hello.txt"}}]}, {"content": "Done."}], loop=True)
        tasks = [Task(id=f"hello-{n}", instruction="Write hello into hello.txt.",
                      grader=ScriptGrader(script="grep -qx hello hello.txt"),
                      environment=TaskEnvironment(image="localhost/orchard-base:local", workdir="/workspace"))
                 for n in range(3)]
        out = tmp_path / "k8s"
        results = await run_eval(harness="kimi-cli", model=SCRIPTED, suite=TaskSuite(name="k8s-kimi", tasks=tasks),
                                 out_dir=out, parallel=1, gateway_config=scripted_config(scripted), backend=config)
        assert [row.status for row in results.tasks] == ["resolved"] * 3, [row.error for row in results.tasks]
        for trajectory in run_trajectories(out):
            assert [s.message for s in trajectory.steps if s.source == "agent"] == ["Write it.", "Done."]
            check_fidelity(trajectory)


async def test_a_task_mcp_tool_through_kimis_own_mcp_client(home, tmp_path, scripted):
    """The task's notes server (streamable HTTP, run as a service) reaches Kimi by --mcp-config-file: the
    scripted model calls its tool by the name Kimi offers, and the services grader reads the note it kept."""
    from orchard.core.task_suite import TaskSuite
    from tests.test_task_mcp import HTTP_NOTES, NOTE_CALL, notes_task

    scripted.load([{"content": "Keeping it.", "tool_calls": [{"id": "call_note", **NOTE_CALL}]}, {"content": "Kept."}])
    await run_eval(harness="kimi-cli", model=SCRIPTED, suite=TaskSuite(name="mcp-suite", tasks=[notes_task(HTTP_NOTES)]),
                   out_dir=tmp_path / "run", gateway_config=scripted_config(scripted), backend="local")
    (done,) = run_trajectories(tmp_path / "run")
    offered = [tool["function"]["name"] for tool in scripted.requests()[0]["tools"]]
    assert NOTE_CALL["name"] in offered, offered
    assert done.outcome.resolved, (done.outcome, done.notes)
    check_fidelity(done)
