"""The `openhands` harness with the real OpenHands SDK 1.58.2 from its harness bundle (built once per session,
the downloads shared) in real embedded sandboxes, through the real evaluator and its gateway: driven by the
oracle (three swe-mini tasks at once, ORACLE_SAMPLE: their patches hold every awkward character; through
OpenHands' own `terminal` and `finish`) and by the scripted model server (parallel tool calls and
`file_editor`; a driver hanging past a short task timeout, one killed mid-run, a crash, failed model calls). Each
trajectory is checked against the gateway's records (no step invented) and exported to ATIF."""

from __future__ import annotations

import subprocess

import pytest

from tests.hang_guard import returns
from orchard.eval.run_config import TrialTimeouts
from orchard.core.atif import to_atif
from orchard.core.trajectory import Trajectory
from orchard.eval.runner import run_eval
from orchard.gateway.config import GatewayConfig
from tests.atif_spec import validate_atif
from tests.harness_rig import ORACLE_SAMPLE, SCRIPTED, scripted_config
from tests.in_sandbox_harness_rig import (check_step_is_reply, home_fixtures, k8s_run, replies_by_id, run_trajectories,
                                          unreachable_model)

pytestmark = pytest.mark.slow
TASK = "orchard__pagekit-112"
OPENHANDS_TOOLS = {"terminal", "file_editor", "task_tracker", "finish", "think"}


bundle_home, home = home_fixtures("openhands")  # the bundle built once per session (a minute or two)


def check_fidelity(trajectory: Trajectory) -> None:
    """Every agent step is one gateway call's reply, found by the response id OpenHands logged and linked to
    that call: same text, same tool calls as the model wrote them, the call's tokens; every tool call has its
    result; the whole exports to valid ATIF."""
    by_response = replies_by_id(trajectory)
    agent_steps = [step for step in trajectory.steps if step.source == "agent"]
    assert len(agent_steps) == len(trajectory.llm_calls)  # no step invented, none missing
    for step in agent_steps:
        call = by_response[step.extra["response_id"]]
        assert step.llm_call_ids == [call.id]
        check_step_is_reply(step, call)
        if step.metrics is not None:  # the usage the SDK read from the response (the oracle reports none)
            assert step.metrics.prompt_tokens == call.prompt_tokens
    assert {tool["function"]["name"] for tool in trajectory.agent.tool_definitions} == OPENHANDS_TOOLS
    validate_atif(to_atif(trajectory))


async def test_the_oracle_resolves_swe_mini_through_openhands_own_tools(home, tmp_path):
    out = tmp_path / "oracle"
    results = await run_eval(harness="openhands", model="oracle", suite="swe-mini", task_ids=ORACLE_SAMPLE,
                             out_dir=out, parallel=len(ORACLE_SAMPLE), gateway_config=GatewayConfig(), backend="local")
    assert [row.status for row in results.tasks] == ["resolved"] * len(ORACLE_SAMPLE), [r.error for r in results.tasks]
    assert sorted(row.task_id for row in results.tasks) == sorted(ORACLE_SAMPLE)
    for trajectory in run_trajectories(out):
        assert trajectory.exit_status == "submitted" and not trajectory.partial
        assert [c.function_name for s in trajectory.steps for c in s.tool_calls] == ["terminal", "terminal", "finish"]
        assert [s.source for s in trajectory.steps] == ["system", "user", "agent", "agent", "agent"]
        check_fidelity(trajectory)
        patch = trajectory.outcome.details["patch"]  # only the fix: no shell history, no SDK state
        assert [line for line in patch.splitlines() if line.startswith("diff --git")] == [
            line for line in patch.splitlines() if line.startswith("diff --git") and ".openhands" not in line
            and "_history" not in line and ".lesshst" not in line]
        kept = trajectory.extra["native_logs"]
        events = next(out / path for path in kept.values() if path.endswith("events"))
        assert len(list(events.glob("event-*.json"))) == 8  # system prompt, task, 3 × (action, observation)


# The agent's shell kills the driver (found by its command line) with SIGKILL: a harness killed mid-run.
KILL_DRIVER = ("for p in /proc/[0-9]*; do grep -q orchard-openhands/driver.py $p/cmdline 2>/dev/null && "
               "kill -9 ${p#/proc/}; done; sleep 5")
FIX = {"command": "str_replace", "path": "/testbed/pagekit/paginator.py",
       "old_str": "        return self.total // self.per_page",
       "new_str": "        return -(-self.total // self.per_page)"}


async def test_the_scripted_model_fixes_a_task_with_parallel_calls_and_the_file_editor(home, tmp_path, scripted):
    """Two tool calls in one reply (one step, both results), the file editor's edit (the task resolved), a
    reasoning text, then finish: each step equal to its gateway record."""
    scripted.load([
        {"content": "Look around.", "tool_calls": [
            {"id": "call_ls", "name": "terminal", "arguments": {"command": "ls pagekit"}},
            {"id": "call_view", "name": "file_editor",
             "arguments": {"command": "view", "path": "/testbed/pagekit/paginator.py"}}]},
        {"content": "Round up.", "reasoning_content": "Integer division drops the last page.",
         "tool_calls": [{"id": "call_fix", "name": "file_editor", "arguments": FIX}]},
        {"content": "", "tool_calls": [{"id": "call_done", "name": "finish", "arguments": {"message": "Fixed."}}]}])
    out = tmp_path / "scripted"
    route = scripted_config(scripted).models[SCRIPTED]  # the gateway asks the server for token ids and logprobs
    tokens = GatewayConfig(models={SCRIPTED: route.model_copy(update={"params": {
        "logprobs": True, "extra_body": {"return_token_ids": True}}})})
    results = await run_eval(harness="openhands", model=SCRIPTED, suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=tokens, backend="local")
    (trajectory,) = run_trajectories(out)
    assert (results.tasks[0].status, trajectory.exit_status) == ("resolved", "submitted"), results.tasks[0].error
    check_fidelity(trajectory)
    agent = [step for step in trajectory.steps if step.source == "agent"]
    assert [[c.tool_call_id for c in step.tool_calls] for step in agent] == [
        ["call_ls", "call_view"], ["call_fix"], ["call_done"]]
    first = {r.source_call_id: r.content for r in agent[0].observation.results}
    assert "paginator.py" in first["call_ls"] and "class Page" in first["call_view"]
    assert agent[1].reasoning_content == "Integer division drops the last page."
    assert all(step.metrics.completion_tokens for step in agent)  # checked against the gateway's above
    # the tokens the policy produced, recorded at the gateway, reached from each step through its call
    assert all(call.completion_token_ids and call.logprobs for call in trajectory.llm_calls)


async def test_a_driver_hanging_past_its_time_is_the_agents_timeout(home, tmp_path, scripted):
    """A model whose command hangs, under a short task timeout: the adapter kills the driver with its
    process group a margin before the evaluator's deadline (orchard/harnesses/deadline.py), reads its events
    within it, and the rollout is the agent's `timeout` with the steps so far from those events, never the
    evaluator's cut-off nor a sandbox error (also with the machine busy: the margin has a floor)."""
    scripted.load([{"content": "Wait.", "tool_calls": [
        {"id": "call_sleep", "name": "terminal", "arguments": {"command": "sleep 600", "timeout": 600}}]}],
        loop=True)
    out = tmp_path / "hang"
    results = await returns(run_eval(harness="openhands", model=SCRIPTED, suite="swe-mini", task_ids=[TASK],
                                     out_dir=out, gateway_config=scripted_config(scripted), backend="local",
                                     timeouts=TrialTimeouts(agent_s=30)), "a run whose agent hangs in a command",
                            within_s=300)
    (row,) = results.tasks
    (hung,) = run_trajectories(out)
    assert row.status == "error" and hung.exit_status == "timeout" and hung.partial, (row, hung.outcome)
    assert "the OpenHands driver ran past its" in hung.outcome.error  # the adapter's kill, not the cut-off
    assert "its process group was killed" in hung.outcome.error and "copied out" not in hung.outcome.error
    assert [c.function_name for s in hung.steps for c in s.tool_calls] == ["terminal"]  # read from its events
    (agent,) = [phase for phase in hung.phases if phase.name == "agent"]
    assert agent.result == "timeout"


async def test_failures_are_errors_with_the_drivers_stderr(home, tmp_path, scripted):
    """Killed mid-run, a crash before the conversation starts, model calls that fail: each an error, not a
    failed attempt."""
    scripted.load([{"content": "Stop.", "tool_calls": [
        {"id": "call_kill", "name": "terminal", "arguments": {"command": KILL_DRIVER}}]}], loop=True)
    out = tmp_path / "killed"
    results = await run_eval(harness="openhands", model=SCRIPTED, suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=scripted_config(scripted), backend="local")
    (row,) = results.tasks
    (killed,) = run_trajectories(out)
    assert row.status == "error" and killed.exit_status == "agent_error" and killed.partial, row.error
    assert "the OpenHands driver exited with code 137" in row.error
    assert [c.function_name for s in killed.steps for c in s.tool_calls] == ["terminal"]

    out = tmp_path / "crash"
    results = await run_eval(harness="openhands", model=SCRIPTED, suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=scripted_config(scripted), backend="local",
                             harness_options={"reasoning_effort": {"not": "a string"}})  # the SDK's LLM refuses it
    (row,) = results.tasks
    assert row.status == "error" and "exited with code 1" in row.error and "ValidationError" in row.error, row.error

    out = tmp_path / "down"
    results = await run_eval(harness="openhands", model="down", suite="swe-mini", task_ids=[TASK], out_dir=out,
                             gateway_config=unreachable_model("down"), backend="local",
                             harness_options={"model_retries": 0})
    (row,) = results.tasks
    (failed,) = run_trajectories(out)
    assert row.status == "error" and failed.exit_status == "model_error", row.error
    assert "the OpenHands conversation failed" in failed.outcome.error


@pytest.mark.k8s
async def test_on_kubernetes_three_tasks_in_pods(home, tmp_path, monkeypatch, scripted):
    """The same harness in Pods of the dev cluster, on its Debian image (swe-mini's tasks need the host image):
    the bundle copied from its injector image, the run's gateway at the node's address, one rollout at a time
    so each gets the script from its start."""
    from orchard.core.task import ScriptGrader, Task, TaskEnvironment
    from orchard.core.task_suite import TaskSuite
    from tests.k8s_cluster import CLUSTER_SCRIPT, NODE_IP, require_cluster

    require_cluster()  # skips before the Debian image is built when no cluster answers
    # OpenHands' terminal needs bash, which the busybox base image lacks: the dev cluster's Debian image
    # (debootstrap the first time, ~70 s, then cached: an import of a second or two)
    subprocess.run(["bash", str(CLUSTER_SCRIPT), "images", "--debian"], check=True, capture_output=True)
    with k8s_run(home, "openhands") as config:
        monkeypatch.setenv("ORCHARD_GATEWAY_HOST", NODE_IP)
        scripted.load([{"content": "Write it.", "tool_calls": [{"name": "terminal", "arguments": {
            "command": "echo hello > hello.txt"}}]},
            {"content": "", "tool_calls": [{"name": "finish", "arguments": {"message": "Written."}}]}], loop=True)
        tasks = [Task(id=f"hello-{n}", instruction="Write hello into hello.txt.",
                      grader=ScriptGrader(script="grep -qx hello hello.txt"),
                      environment=TaskEnvironment(image="localhost/orchard-debian:local", workdir="/workspace"))
                 for n in range(3)]
        out = tmp_path / "k8s"
        results = await run_eval(harness="openhands", model=SCRIPTED, suite=TaskSuite(name="k8s-openhands",
                                                                                      tasks=tasks),
                                 out_dir=out, parallel=1, gateway_config=scripted_config(scripted), backend=config)
        assert [row.status for row in results.tasks] == ["resolved"] * 3, [row.error for row in results.tasks]
        for trajectory in run_trajectories(out):
            assert [c.function_name for s in trajectory.steps for c in s.tool_calls] == ["terminal", "finish"]
            check_fidelity(trajectory)


async def test_a_task_mcp_tool_through_the_agents_own_mcp_client(home, tmp_path, scripted):
    """The task's notes server (streamable HTTP, run as a service) reaches the OpenHands agent by its
    mcp_config: the scripted model calls its tool by the name the agent offers, and the services grader reads
    the note it kept."""
    from orchard.core.task_suite import TaskSuite
    from tests.test_task_mcp import HTTP_NOTES, NOTE_CALL, notes_task

    scripted.load([{"content": "Keeping it.", "tool_calls": [{"id": "call_note", **NOTE_CALL}]},
                   {"content": "Kept.", "tool_calls": [{"id": "call_finish", "name": "finish",
                                                        "arguments": {"message": "kept"}}]}])
    await run_eval(harness="openhands", model=SCRIPTED, suite=TaskSuite(name="mcp-suite", tasks=[notes_task(HTTP_NOTES)]),
                   out_dir=tmp_path / "run", gateway_config=scripted_config(scripted), backend="local")
    (done,) = run_trajectories(tmp_path / "run")
    offered = [tool["function"]["name"] for tool in scripted.requests()[0]["tools"]]
    assert NOTE_CALL["name"] in offered, offered
    assert done.outcome.resolved, (done.outcome, done.notes)
