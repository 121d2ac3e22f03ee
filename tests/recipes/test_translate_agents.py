"""Cross-harness distillation into and out of Kimi-CLI and OpenHands, on real parts: rollouts recorded by real
runs (react in-process; the real Kimi-CLI 1.51.0 and OpenHands SDK 1.58.2 from their bundles in real
sandboxes), translated, then replayed — into Kimi-CLI or OpenHands by running that real harness with a
script policy that makes the translated calls (its own tools run them), into react or mini-swe-agent by
their tools — and the diff each replay leaves must be the source's. The harnesses' prompts are captured
from the harnesses themselves (first request of a run, cached in the home's cache, the session's)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from orchard.core.actions import Create, Edits, Insert, Replace, Shell, Submit, UntranslatableCall, View
from orchard.core.captured_prompts import load_prompt, prompt_path
from orchard.core.dialect import harness_dialect
from orchard.core.trajectory import ObservationResult, Trajectory
from orchard.eval.models import eval_gateway_config
from orchard.eval.suites import load_suite
from orchard.recipes.translate.captured import capture_prompts
from orchard.recipes.translate.harness_replay import replay_in_harness, run_scripted
from orchard.recipes.translate.replay import replay_patch
from orchard.recipes.translate.trajectory import translate_trajectory
from orchard.sandbox.client import AsyncOrchard
from orchard.util.shell_forms import shell_command
from tests.recipes.test_translate import PAGEKIT, REACT_SCRIPT, record, scripted_config

WORKDIR = "/testbed"
FIX_OLD = "        return self.total // self.per_page\n"
FIX_NEW = "        # Round up: a partially filled last page is still a page.\n        return -(-self.total // self.per_page)\n"


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _reply(content: str, *calls: dict) -> dict:
    return {"role": "assistant", "content": content, **({"tool_calls": list(calls)} if calls else {})}


# Kimi's own file tools on a real task: a range read, a fix among several edits, a new file, an append, a shell
KIMI_SCRIPT = [
    _reply("Read the pager.", _call("k1", "ReadFile", {"path": "pagekit/paginator.py", "line_offset": 15,
                                                        "n_lines": 8})),
    _reply("Fix it.", _call("k2", "StrReplaceFile", {"path": "pagekit/paginator.py", "edit": [
        {"old": FIX_OLD, "new": FIX_NEW}, {"old": "PageOutOfRange", "new": "PageOutOfRange", "replace_all": True}]})),
    _reply("Note it.", _call("k3", "WriteFile", {"path": "notes.txt", "content": "pages round up"})),
    _reply("More.", _call("k4", "WriteFile", {"path": "notes.txt", "content": "\nand more\n", "mode": "append"})),
    _reply("Check.", _call("k5", "Shell", {"command": "python -c 'import pagekit' && echo ok"})),
    _reply("Fixed: the last page now counts."),
]
# OpenHands' file_editor: a directory and a range viewed, the fix, an insert, a new file; terminal; finish
OPENHANDS_SCRIPT = [
    _reply("Look.", _call("o1", "file_editor", {"command": "view", "path": WORKDIR})),
    _reply("", _call("o2", "file_editor", {"command": "view", "path": f"{WORKDIR}/pagekit/paginator.py",
                                           "view_range": [15, 22]})),
    _reply("Fix.", _call("o3", "file_editor", {"command": "str_replace", "path": f"{WORKDIR}/pagekit/paginator.py",
                                               "old_str": FIX_OLD, "new_str": FIX_NEW})),
    _reply("Mark.", _call("o4", "file_editor", {"command": "insert", "path": f"{WORKDIR}/pagekit/paginator.py",
                                                "insert_line": 1, "new_str": "# pages round up"}),
           _call("o5", "file_editor", {"command": "create", "path": f"{WORKDIR}/NOTES.md", "file_text": "x\n"})),
    _reply("", _call("o6", "terminal", {"command": "git status --short"})),
    _reply("Done.", _call("o7", "finish", {"message": "rounded up"})),
]


@pytest.fixture(scope="module")
def agents_home(tmp_path_factory, session_bundles) -> Path:
    """An Orchard home whose cache (the session's) holds the kimi-cli and openhands bundles, built at most
    once per session (the harness modules' homes share them)."""
    return session_bundles.home(tmp_path_factory.mktemp("agents-home"), "kimi-cli", "openhands")


def _names(trajectory: Trajectory) -> list[str]:
    return [c.function_name for s in trajectory.steps for c in s.tool_calls]


async def translate_and_replay(source: Trajectory, target: str, orchard: AsyncOrchard):
    """Capture the target harness's prompt for the task, translate, and run the target harness itself on
    the translated replies: the diff it leaves must be the source's."""
    await capture_prompts(target, [source.task_id], orchard_client=orchard)
    translated = translate_trajectory(source, target)
    replayed = await replay_in_harness([translated], suite="swe-mini", orchard_client=orchard)
    assert replayed[source.task_id].outcome.details["patch"] == source.outcome.details["patch"]
    return translated, replayed[source.task_id]


async def _replays_in(home: Path, source: Trajectory, target: str) -> Trajectory:
    """`source` translated into the in-sandbox harness `target` and run by it: it leaves the source's diff."""
    async with AsyncOrchard(home=home) as orchard:
        translated, replayed = await translate_and_replay(source, target, orchard)
    assert replayed.agent.name == target and replayed.outcome.error is None, replayed.outcome
    assert replayed.outcome.resolved == source.outcome.resolved
    # the run made exactly the translated calls, and its first request is the captured prompt's
    assert [(c.function_name, c.arguments) for s in replayed.steps for c in s.tool_calls] == \
        [(c.function_name, c.arguments) for s in translated.steps for c in s.tool_calls]
    assert replayed.llm_calls[0].request_params["tools"] == translated.llm_calls[0].request_params["tools"]
    assert replayed.llm_calls[0].request_messages[1] == translated.llm_calls[0].request_messages[1]
    return translated


async def _replays_by_tools(home: Path, source: Trajectory, target: str) -> Trajectory:
    translated = translate_trajectory(source, target)
    async with AsyncOrchard(home=home) as orchard:
        replayed = await replay_patch(orchard, load_suite("swe-mini").get(source.task_id), translated)
    assert replayed.patch == source.outcome.details["patch"] and replayed.patch.strip()
    return translated


@pytest.mark.slow
@pytest.mark.timeout(1200)  # builds both bundles when no other module of the session has (~2 min)
async def test_react_rollouts_replay_in_kimi_cli_and_openhands(agents_home, tmp_path, monkeypatch, scripted):
    monkeypatch.setenv("ORCHARD_HOME", str(agents_home))
    (oracle,) = await record(agents_home, tmp_path / "oracle", harness="react", model="oracle",
                             config=eval_gateway_config("oracle"), tasks=[PAGEKIT])
    scripted.load(REACT_SCRIPT)
    (edited,) = await record(agents_home, tmp_path / "scripted", harness="react", model="scripted",
                             config=scripted_config(scripted.url), tasks=[PAGEKIT])
    async with AsyncOrchard(home=agents_home) as orchard:
        for harness in ("kimi-cli", "openhands"):
            await capture_prompts(harness, [PAGEKIT], orchard_client=orchard)
    kimi = harness_dialect("kimi-cli")
    assert prompt_path("kimi-cli", kimi.version, PAGEKIT).is_file()
    captured = load_prompt("kimi-cli", kimi.version, PAGEKIT)
    assert "Kimi" in captured.messages[0]["content"] and {t["function"]["name"] for t in captured.tools} >= {
        "Shell", "ReadFile", "WriteFile", "StrReplaceFile"}

    for source in (oracle, edited):
        for target in ("kimi-cli", "openhands"):
            await _replays_in(agents_home, source, target)
    to_kimi = translate_trajectory(edited, "kimi-cli")
    # view dir -> react's listing; view range -> ReadFile; str_replace -> StrReplaceFile (twice: one fails);
    # a new file in a new directory -> the shell (Kimi's WriteFile needs the directory); the mid-run reply
    # without a tool call is left out (it would end Kimi's run); submit -> a reply without tool calls
    assert _names(to_kimi) == ["Shell", "ReadFile", "StrReplaceFile", "Shell", "Shell", "StrReplaceFile"]
    assert to_kimi.steps[-1].source == "agent" and not to_kimi.steps[-1].tool_calls
    to_openhands = translate_trajectory(edited, "openhands")
    assert _names(to_openhands) == ["file_editor", "file_editor", "file_editor", "terminal", "terminal",
                                    "file_editor", "finish"]


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_kimi_cli_and_openhands_rollouts_replay_in_every_other_harness(agents_home, monkeypatch):
    monkeypatch.setenv("ORCHARD_HOME", str(agents_home))
    async with AsyncOrchard(home=agents_home) as orchard:
        kimi = (await run_scripted("kimi-cli", {PAGEKIT: KIMI_SCRIPT}, suite="swe-mini",
                                   orchard_client=orchard)).trajectories[PAGEKIT]
        openhands = (await run_scripted("openhands", {PAGEKIT: OPENHANDS_SCRIPT}, suite="swe-mini",
                                        orchard_client=orchard)).trajectories[PAGEKIT]
    for source, names in [(kimi, ["ReadFile", "StrReplaceFile", "WriteFile", "WriteFile", "Shell"]),
                          (openhands, ["file_editor"] * 5 + ["terminal", "finish"])]:
        assert source.outcome.error is None and _names(source) == names and source.outcome.resolved
    assert "+pages round up\n+and more\n" in kimi.outcome.details["patch"]  # written, then appended to

    to_react = await _replays_by_tools(agents_home, kimi, "react")
    assert _names(to_react) == ["view", "bash", "create", "bash", "bash", "submit"]
    await _replays_by_tools(agents_home, kimi, "mini-swe-agent")
    to_openhands = await _replays_in(agents_home, kimi, "openhands")
    assert _names(to_openhands) == ["file_editor", "terminal", "terminal", "terminal", "terminal", "finish"]

    to_kimi = await _replays_in(agents_home, openhands, "kimi-cli")
    assert _names(to_kimi) == ["Shell", "ReadFile", "StrReplaceFile", "Shell", "WriteFile", "Shell"]
    await _replays_by_tools(agents_home, openhands, "react")
    to_mini = await _replays_by_tools(agents_home, openhands, "mini-swe-agent")
    # the observations carried over are the commands' outputs, without the source harness's own framing
    tool_message = next(m for m in to_mini.llm_calls[-1].request_messages if m["role"] == "tool"
                        and "M pagekit/paginator.py" in m["content"])
    assert "[Command finished" not in tool_message["content"]


# --- fast: the vocabularies and the result formats -------------------------------------------------------

def test_kimi_and_openhands_calls_round_trip_through_the_actions():
    kimi, openhands = harness_dialect("kimi-cli"), harness_dialect("openhands")
    actions = [Shell("ls"), View("a.py", (3, 9)), Replace("a.py", "x", "y"), Submit("done"),
               Edits("a.py", (("x", "y", False), ("z", "w", True))), Create("b.py", "text", overwrites=True),
               Create("c.txt", "more", append=True)]
    for action in actions:
        written = kimi.write_call(action, WORKDIR)
        if isinstance(action, Submit):
            assert written is None  # Kimi ends with a plain reply
            continue
        read = kimi.read_call(*written, "")
        assert read == (dataclasses.replace(action, overwrites=None) if isinstance(action, Create) else action)
    assert kimi.write_call(Create("new/dir/f.py", "x", overwrites=False), WORKDIR)[0] == "Shell"
    assert kimi.write_call(Create("f.py", "x", overwrites=False), WORKDIR)[0] == "WriteFile"
    for action in [Shell("ls"), View("/testbed/a.py", (3, 9)), Replace("/testbed/a.py", "x", "y"),
                   Insert("/testbed/a.py", 2, "z"), Create("/testbed/f.py", "x", overwrites=False), Submit("ok")]:
        assert openhands.read_call(*openhands.write_call(action, WORKDIR), "") == action
    assert openhands.write_call(View("a.py"), WORKDIR)[1]["path"] == "/testbed/a.py"  # its editor takes absolute paths
    assert openhands.write_call(Create("f.py", "x"), WORKDIR)[0] == "terminal"  # may exist: create would refuse
    for harness, name, arguments in [("kimi-cli", "Grep", {"pattern": "x"}), ("openhands", "think", {"thought": "t"}),
                                     ("openhands", "terminal", {"command": "C-c", "is_input": True})]:
        with pytest.raises(UntranslatableCall):
            harness_dialect(harness).read_call(name, arguments, "")


def test_edits_insert_and_append_as_shell_commands_match_the_harnesses(tmp_path):
    """Kimi's StrReplaceFile (first occurrence or all, in turn; an error when nothing changed), OpenHands'
    insert (after line N, the text's lines each ended) and Kimi's append, run with real bash."""

    def bash(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)

    (tmp_path / "f.txt").write_text("a a\nb\n")
    assert bash(shell_command(Edits("f.txt", (("a", "x", False), ("b", "y y", False), ("y", "z", True))))).returncode == 0
    assert (tmp_path / "f.txt").read_text() == "x a\nz z\n"
    unchanged = bash(shell_command(Edits("f.txt", (("nowhere", "x", False),))))
    assert unchanged.returncode != 0 and "No replacements were made" in unchanged.stderr
    assert bash(shell_command(Insert("f.txt", 1, "new\nlines"))).returncode == 0
    assert (tmp_path / "f.txt").read_text() == "x a\nnew\nlines\nz z\n"
    assert bash(shell_command(Insert("f.txt", 0, "top"))).returncode == 0
    assert (tmp_path / "f.txt").read_text().startswith("top\nx a\n")
    assert bash(shell_command(Insert("f.txt", 99, "x"))).returncode != 0
    assert bash(shell_command(Create("f.txt", "tail without newline", append=True))).returncode == 0
    assert (tmp_path / "f.txt").read_text().endswith("z z\ntail without newline")


def test_tool_results_are_read_out_of_each_harness_framing():
    kimi, openhands = harness_dialect("kimi-cli"), harness_dialect("openhands")
    ok = ObservationResult(source_call_id="c", content="<system>Command executed successfully.</system>hi\n")
    failed = ObservationResult(source_call_id="c", content="<system>ERROR: Command failed with exit code: 2.</system>no\n")
    assert (kimi.read_result("Shell", ok).output, kimi.read_result("Shell", ok).returncode) == ("hi\n", 0)
    assert kimi.read_result("Shell", failed).returncode == 2
    assert kimi.result_text("Shell", kimi.read_result("Shell", failed)) == failed.content  # Kimi's own framing back
    terminal = ObservationResult(source_call_id="c", content=(
        "M a.py\n[The command completed with exit code 1.]\n[Current working directory: /testbed]\n"
        "[Python interpreter: /usr/bin/python]\n[Command finished with exit code 1]"))
    observed = openhands.read_result("terminal", terminal)
    assert (observed.output, observed.returncode) == ("M a.py\n", 1)


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_orchard_train_sft_target_harness_kimi_cli_captures_and_trains(agents_home, tmp_path, monkeypatch):
    """`orchard train sft --target-harness kimi-cli` on react oracle rollouts: Kimi's prompt is captured
    (once; cached in ORCHARD_HOME), the rollouts translated, and a tiny model trained on Kimi's calls."""
    import asyncio

    from typer.testing import CliRunner

    from orchard.cli.main import app
    from tests.recipes.sft_rig import tiny_model_dir

    monkeypatch.setenv("ORCHARD_HOME", str(agents_home))
    await record(agents_home, tmp_path / "oracle", harness="react", model="oracle",
                 config=eval_gateway_config("oracle"), tasks=[PAGEKIT])
    model = tiny_model_dir(tmp_path / "tiny")
    result = await asyncio.to_thread(CliRunner().invoke, app, [
        "train", "sft", str(tmp_path / "oracle"), "--model", str(model), "--out", str(tmp_path / "sft"),
        "--target-harness", "kimi-cli", "--max-steps", "1", "--grad-accum", "1"])
    assert result.exit_code == 0, result.output
    assert load_prompt("kimi-cli", harness_dialect("kimi-cli").version, PAGEKIT) is not None
    metrics = json.loads((tmp_path / "sft" / "metrics.json").read_text())
    assert metrics["data"]["examples"] == 3 and (tmp_path / "sft" / "model" / "config.json").is_file()
