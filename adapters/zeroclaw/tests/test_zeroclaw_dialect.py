"""ZeroClaw's dialect: its tools read into Orchard's neutral actions and written back, its prompt and result
framing; then, on real rollouts of swe-mini, translation both ways (react's oracle rollouts into zeroclaw,
zeroclaw's into react and mini-swe-agent) replayed by the target's own tools to the source's diff, a delegated
sub-agent's calls replayed, and `orchard train sft --target-harness zeroclaw` training on translated rollouts."""

from __future__ import annotations

import asyncio
import json

import pytest
from zeroclaw_rig import orchard, scripted_model, trajectories

from orchard.core.actions import (Create, Edits, Insert, McpCall, Replace, Shell, Submit, UnreplayableCall,
                                  UntranslatableCall, View)
from orchard.core.dialect import Observed, dialect_harnesses, harness_dialect
from orchard.core.trajectory import Agent, Observation, ObservationResult, Step, ToolCall, Trajectory
from orchard.eval.suites import load_suite
from orchard.recipes.translate.replay import replay_patch
from orchard.recipes.translate.trajectory import translate_trajectory
from orchard.sandbox.client import AsyncOrchard
from orchard.util.shell_forms import shell_command
from orchard_zeroclaw.dialect import ZeroClawDialect
from orchard_zeroclaw.profile.config import ProfileConfig
from orchard_zeroclaw.profile.prompt import system_prompt

PAGEKIT = "orchard__pagekit-112"
PAGER = "pagekit/paginator.py"


def dialect() -> ZeroClawDialect:
    return ZeroClawDialect(ProfileConfig(), version="v")


def test_the_registered_harness_declares_the_dialect():
    found = harness_dialect("zeroclaw")
    assert isinstance(found, ZeroClawDialect) and found.name == "zeroclaw" and "zeroclaw" in dialect_harnesses()
    assert found.ends_on_reply and not found.captures_prompt and found.no_tool_call_message() is None


@pytest.mark.parametrize("action, written", [
    (Shell("ls -la"), ("shell", {"command": "ls -la"})),
    (View("a.py"), ("file_read", {"path": "a.py"})),
    (View("a.py", (3, 9)), ("file_read", {"path": "a.py", "offset": 3, "limit": 7})),
    (View("a.py", (4, -1)), ("file_read", {"path": "a.py", "offset": 4})),
    (Create("d/n.txt", "x\n"), ("file_write", {"path": "d/n.txt", "content": "x\n"})),
    (Replace("a.py", "old", "new"), ("file_edit", {"path": "a.py", "old_string": "old", "new_string": "new"})),
])
def test_each_action_is_one_of_its_calls_and_reads_back_the_same(action, written):
    assert dialect().write_call(action, "/testbed") == written
    assert dialect().read_call(*written, "") == action


@pytest.mark.parametrize("action", [View("pkg", is_dir=True), Create("a.txt", "more\n", append=True),
                                    Edits("a.py", (("a", "b", True),)), Insert("a.py", 2, "x\n"),
                                    McpCall("mail", "reply", '{"message_id": "m1", "body": "Yes."}')])
def test_what_its_tools_cannot_express_goes_through_its_shell(action):
    assert dialect().write_call(action, "/testbed") == ("shell", {"command": shell_command(action)})


def test_its_mcp_tools_are_mcp_calls_which_it_writes_as_mcp_call_commands():
    call = dialect().read_call("mail__reply", {"message_id": "m1", "body": "Yes, it's approved."}, "")
    assert call == McpCall("mail", "reply", '{"message_id": "m1", "body": "Yes, it\'s approved."}')
    assert dialect().write_call(call, "/testbed") == ("shell", {"command": (
        "/tmp/.orchard-mcp/mcp-call mail reply '{\"message_id\": \"m1\", \"body\": \"Yes, it'\"'\"'s approved.\"}'")})


def test_a_reply_ends_its_run_and_its_other_tools_have_no_action():
    assert dialect().write_call(Submit("done"), "/testbed") is None
    for name in ("glob_search", "content_search", "memory_store", "TodoWrite", "delegate"):
        with pytest.raises(UntranslatableCall, match=f"zeroclaw's tool '{name}' has no equivalent"):
            dialect().read_call(name, {"pattern": "x"}, "")
    with pytest.raises(UntranslatableCall, match="invalid arguments"):
        dialect().read_call("shell", {}, "")


def test_results_are_framed_as_zeroclaw_frames_them():
    zc = dialect()
    ok, failed = ObservationResult(source_call_id="c", content="out\n"), ObservationResult(
        source_call_id="c", content="Error: bad\n")
    assert zc.read_result("shell", ok) == Observed("out\n", 0)
    assert zc.read_result("shell", failed) == Observed("bad\n", 1)
    assert zc.read_result("shell", ObservationResult(source_call_id="c", content="(no output)")) == Observed("", 0)
    assert zc.result_text("shell", Observed("", 0)) == "(no output)"
    assert zc.result_text("shell", Observed("bad\n", 2)) == "Error: bad\n"  # ZeroClaw shows no exit code
    assert zc.result_messages([("c", "shell", Observed("hi\n", 0))]) == [
        {"role": "tool", "tool_call_id": "c", "content": "hi\n"}]


def test_its_first_messages_and_the_task_read_back_out_of_them():
    messages, tools = dialect().initial_messages(PAGEKIT, "Fix the pager.", "/testbed")
    assert messages == [{"role": "system", "content": system_prompt("/testbed")},
                        {"role": "user", "content": "Fix the pager."}]
    assert [tool["function"]["name"] for tool in tools][:4] == ["shell", "file_read", "file_write", "file_edit"]
    trajectory = Trajectory(agent=Agent(name="zeroclaw", version="v"), steps=[
        Step(step_id=1, source="system", message=messages[0]["content"]),
        Step(step_id=2, source="user", message="Fix the pager.")])
    task = dialect().read_task(trajectory)
    assert (task.instruction, task.workdir) == ("Fix the pager.", "/testbed")


def test_a_call_that_cannot_be_replayed_is_refused_before_a_sandbox_starts():
    tools = [{"type": "function", "function": {"name": name}} for name in ("shell", "notes__add_note")]
    trajectory = Trajectory(agent=Agent(name="zeroclaw", version="v", tool_definitions=tools), steps=[Step(
        step_id=1, source="agent", tool_calls=[ToolCall(tool_call_id="c1", function_name="notes__add_note")],
        observation=Observation(results=[ObservationResult(source_call_id="c1", content="kept")]))])
    with pytest.raises(UnreplayableCall, match="a task's MCP tool"):
        dialect().replay(trajectory, "/testbed")
    trajectory.steps[0].tool_calls[0] = ToolCall(tool_call_id="c1", function_name="delegate",
                                                 arguments={"agent": "worker", "prompt": "p"})
    with pytest.raises(UnreplayableCall, match="its sub-agent's trajectory is not in the rollout"):
        dialect().replay(trajectory, "/testbed")


# --- real rollouts ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    """Rollouts of PAGEKIT recorded by `orchard eval`: react and zeroclaw with the oracle, and zeroclaw with a
    scripted model that fixes the pager through file_read, file_edit and a delegated sub-agent's shell."""
    base = tmp_path_factory.mktemp("rollouts")
    recorded = {}
    for harness in ("react", "zeroclaw"):
        ran = orchard("eval", "--harness", harness, *(["--harness-option", "binary="] if harness == "zeroclaw" else []),
                      "--model", "oracle", "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(base / harness),
                      home=base / "home")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        (recorded[harness],) = trajectories(base / harness)
    old = "        return self.total // self.per_page\n"
    new = "        return -(-self.total // self.per_page)\n"
    script = [
        {"content": "Reading.", "tool_calls": [{"id": "c1", "name": "file_read",
                                                "arguments": {"path": PAGER, "offset": 1, "limit": 40}}]},
        {"content": "", "tool_calls": [{"id": "c2", "name": "delegate", "arguments": {
            "agent": "worker", "prompt": "Add a note on page counts to NOTES.md."}}]},
        {"content": "", "tool_calls": [{"id": "s1", "name": "shell",
                                        "arguments": {"command": "echo 'pages round up' > NOTES.md"}}]},
        {"content": "Noted."},
        {"content": "", "tool_calls": [{"id": "c3", "name": "file_edit", "arguments": {
            "path": PAGER, "old_string": old, "new_string": new}}]},
        {"content": "Fixed."},
    ]
    with scripted_model(script, base) as url:
        ran = orchard("eval", "--harness", "zeroclaw", "--harness-option", "binary=", "--model", "openai/scripted",
                      "--api-base", url, "--api-key", "none", "--suite", "swe-mini", "--tasks", PAGEKIT,
                      "--out", str(base / "scripted"), home=base / "home")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (recorded["scripted"],) = trajectories(base / "scripted")
    return base / "home", recorded


def _calls(trajectory: Trajectory) -> list[str]:
    return [c.function_name for s in trajectory.steps if not s.is_copied_context for c in s.tool_calls]


@pytest.mark.slow
def test_rollouts_translate_both_ways_and_replay_to_the_same_diff(rollouts):
    home, recorded = rollouts
    react, oracle, scripted = recorded["react"], recorded["zeroclaw"], recorded["scripted"]
    assert react.outcome.resolved and oracle.outcome.resolved and scripted.outcome.error is None
    assert scripted.subagent_trajectories and _calls(scripted) == ["file_read", "delegate", "file_edit"]
    task = load_suite("swe-mini").get(PAGEKIT)

    async def check():
        async with AsyncOrchard(home=home) as orch:
            own = await replay_patch(orch, task, scripted)  # its own calls, the sub-agent's shell included
            assert own.patch == scripted.outcome.details["patch"] and "NOTES.md" in own.patch
            for source, target in [(react, "zeroclaw"), (oracle, "react"), (oracle, "mini-swe-agent")]:
                translated = translate_trajectory(source, target)
                assert translated.agent.name == target
                replayed = await replay_patch(orch, task, translated)
                assert replayed.patch == source.outcome.details["patch"] and replayed.patch.strip(), (
                    source.agent.name, target)

    asyncio.run(check())
    into = translate_trajectory(react, "zeroclaw")
    assert _calls(into) == ["shell", "shell"]  # react's submit: ZeroClaw's closing reply
    assert into.steps[0].message == system_prompt("/testbed") and into.steps[1].message == task.instruction
    assert into.llm_calls[-1].response["choices"][0]["message"]["content"]  # the reply that ends the run
    assert json.loads(into.steps[2].tool_calls[0].raw_arguments)["command"].startswith("cd /testbed && git apply")
    with pytest.raises(UntranslatableCall, match="'delegate' has no equivalent"):
        translate_trajectory(scripted, "react")  # a delegated run is ZeroClaw's own


@pytest.mark.slow
@pytest.mark.model
def test_orchard_train_sft_trains_on_rollouts_translated_into_zeroclaw(rollouts, tmp_path):
    pytest.importorskip("torch")
    from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3

    home, _ = rollouts
    tokenizer = smollm2_tokenizer()
    model = tmp_path / "tiny"
    tiny_qwen3(tokenizer).save_pretrained(str(model))
    tokenizer.save_pretrained(str(model))
    trained = orchard("train", "sft", str(home.parent / "react"), "--model", str(model), "--out", str(tmp_path / "sft"),
                      "--target-harness", "zeroclaw", "--max-steps", "1", "--grad-accum", "1", home=home)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    metrics = json.loads((tmp_path / "sft" / "metrics.json").read_text())
    assert metrics["data"]["examples"] == 3  # apply, check, and ZeroClaw's closing reply
    assert (tmp_path / "sft" / "model" / "config.json").is_file()
