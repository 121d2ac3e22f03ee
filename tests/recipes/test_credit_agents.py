"""Credit assignment on failed rollouts of the harnesses that run inside the sandbox: the real Kimi-CLI and
OpenHands (from their bundles, the session's cache) run a swe-mini task with a script policy that makes a
wrong fix, and their rollouts are replayed with bash, each call as the exact equivalent of that harness's
own tool (their dialects' replay: orchard/harnesses/kimi_cli/dialect.py, openhands/dialect.py). The replay
must end with the diff the harness left, and the diff after each step gives the hindsight values. Fast tests: the exact scripts run with real bash
against what the harnesses' tools do (their code, read from Kimi-CLI 1.51.0 and the OpenHands SDK 1.58.2),
and the calls refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchard.core.actions import UnreplayableCall
from orchard.core.dialect import harness_dialect
from orchard.core.trajectory import Agent, Observation, ObservationResult, Step, ToolCall, Trajectory
from orchard.eval.suites import load_suite
from orchard.harnesses.exact_replay import REFUSED
from orchard.recipes.credit.assign import assign_credit
from orchard.recipes.credit.values import CreditSettings
from orchard.recipes.translate.harness_replay import run_scripted
from orchard.sandbox.client import AsyncOrchard
from tests.recipes.test_translate import PAGEKIT
from tests.recipes.test_translate_agents import _call, _reply

WORKDIR = "/testbed"
PAGER = "pagekit/paginator.py"
OLD = "        return self.total // self.per_page\n"
COMMENT = "        # Round up: a partially filled last page is still a page.\n"
WRONG = "        return self.total // self.per_page + 1\n"
PROPERTY = "    @property\n"  # three times in the file

# Kimi: names the gold file, half of the gold patch, a write its tool refuses (no such directory: react's
# create would have made it), an edit of the first of three occurrences (react's str_replace refuses
# that), the wrong fix, a read; then the final reply
KIMI_FAILED = [
    _reply("", _call("k1", "Shell", {"command": f"grep -n per_page {PAGER}"})),
    _reply("", _call("k2", "StrReplaceFile", {"path": PAGER, "edit": {"old": OLD, "new": COMMENT + OLD}})),
    _reply("", _call("k3", "WriteFile", {"path": "no/such/dir/notes.txt", "content": "x\n"})),
    _reply("", _call("k4", "StrReplaceFile", {"path": PAGER, "edit": {"old": PROPERTY,
                                                                      "new": "    @property  # x\n"}})),
    _reply("", _call("k5", "StrReplaceFile", {"path": PAGER, "edit": {"old": OLD, "new": WRONG}})),
    _reply("", _call("k6", "ReadFile", {"path": PAGER})),
    _reply("Added one page."),
]
# OpenHands: a `cd` that the next terminal call relies on, the editor's half of the gold patch, the wrong
# fix by a command run in that directory, a view, finish
OPENHANDS_FAILED = [
    _reply("", _call("o1", "terminal", {"command": "cd pagekit && grep -n per_page paginator.py"})),
    _reply("", _call("o2", "file_editor", {"command": "str_replace", "path": f"{WORKDIR}/{PAGER}",
                                           "old_str": OLD, "new_str": COMMENT + OLD})),
    _reply("", _call("o3", "terminal", {"command": "sed -i 's|// self.per_page$|// self.per_page + 1|' paginator.py"})),
    _reply("", _call("o4", "file_editor", {"command": "view", "path": f"{WORKDIR}/{PAGER}", "view_range": [15, 24]})),
    _reply("", _call("o5", "finish", {"message": "added one page"})),
]


@pytest.fixture(scope="module")
def agents_home(tmp_path_factory, session_bundles) -> Path:
    return session_bundles.home(tmp_path_factory.mktemp("credit-agents-home"), "kimi-cli", "openhands")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # builds both bundles when no other module of the session has (~2 min)
async def test_failed_kimi_cli_and_openhands_rollouts_replay_exactly_and_get_credit(agents_home, monkeypatch):
    monkeypatch.setenv("ORCHARD_HOME", str(agents_home))
    task = load_suite("swe-mini").get(PAGEKIT)
    async with AsyncOrchard(home=agents_home) as orchard:
        kimi = (await run_scripted("kimi-cli", {PAGEKIT: KIMI_FAILED}, suite="swe-mini",
                                   orchard_client=orchard)).trajectories[PAGEKIT]
        openhands = (await run_scripted("openhands", {PAGEKIT: OPENHANDS_FAILED}, suite="swe-mini",
                                        orchard_client=orchard)).trajectories[PAGEKIT]
        for rollout in (kimi, openhands):
            assert rollout.outcome.error is None and rollout.outcome.resolved is False, rollout.outcome
            patch = rollout.outcome.details["patch"]
            assert WRONG.strip() in patch and COMMENT.strip() in patch
        assert "notes.txt" not in kimi.outcome.details["patch"]  # Kimi's WriteFile refused: no such directory

        report = await assign_credit([kimi, openhands], {PAGEKIT: task}, orchard,
                                     CreditSettings(smoothing=0.0, run_tests=False))
    by_harness = {credit.harness: credit for credit in report.rollouts}
    assert set(by_harness) == {"kimi-cli", "openhands"}
    for credit in by_harness.values():  # each replay ended with the diff the harness left
        assert credit.error is None and credit.replay_matches_record, credit
    # the diff after each step against the gold patch: nothing, the comment (F1 0.5), the wrong return
    # (2 of 3 lines each way); Kimi's refused write changes nothing, its edit of the first @property adds
    # two lines the gold patch lacks; a read, the end
    kimi_values = by_harness["kimi-cli"].proxies["diff_overlap"]
    assert kimi_values == pytest.approx([0.0, 0.5, 0.5, 1 / 3, 0.5, 0.5, 0.5])
    assert "+    @property  # x\n     def num_pages" in kimi.outcome.details["patch"]
    assert by_harness["openhands"].proxies["diff_overlap"] == pytest.approx([0.0, 0.5, 2 / 3, 2 / 3, 2 / 3])
    # the ascent before the (first) peak is trained, ∝ Δ; nothing after it, never the failed end. Kimi's
    # first command names the gold file (gold_files_opened rises), OpenHands' names it after a `cd`
    for rollout, credit, ascent in ((kimi, by_harness["kimi-cli"], slice(0, 2)),
                                    (openhands, by_harness["openhands"], slice(1, 3))):
        agent_ids = [s.step_id for s in rollout.steps if s.source == "agent"]
        assert set(credit.step_weights) == set(agent_ids[ascent]) and len(credit.segments) == 1
        assert credit.step_weights == pytest.approx({s.step_id: s.delta for s in credit.steps
                                                     if s.step_id in credit.step_weights})


# --- fast: the exact scripts with real bash, the refusals ------------------------------------------------

def _rollout(harness: str, calls: list[tuple[str, dict, str]]) -> Trajectory:
    steps = [Step(step_id=1, source="user", message="u")]
    for number, (name, arguments, result) in enumerate(calls):
        steps.append(Step(step_id=number + 2, source="agent", tool_calls=[
            ToolCall(tool_call_id=f"c{number}", function_name=name, arguments=arguments)],
            observation=Observation(results=[ObservationResult(source_call_id=f"c{number}", content=result)])))
    return Trajectory(agent=Agent(name=harness, version="1"), task_id="t", rollout_key="r", steps=steps)


def _run(tmp_path: Path, harness: str, calls: list[tuple[str, dict, str]]) -> list[subprocess.CompletedProcess]:
    done = []
    for exact in harness_dialect(harness).replay(_rollout(harness, calls), str(tmp_path)).plan.values():
        if exact.command is not None:
            done.append(subprocess.run(["bash", "-c", exact.command], cwd=tmp_path, capture_output=True,
                                       text=True))
    return done


def test_kimi_file_tools_replay_as_kimi_runs_them(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x x\r\ny\r\n")
    runs = _run(tmp_path, "kimi-cli", [
        ("StrReplaceFile", {"path": "a.txt", "edit": {"old": "x", "new": "z"}}, ""),  # the first of two
        ("StrReplaceFile", {"path": "a.txt", "edit": [{"old": "y", "new": "w", "replace_all": True}]}, ""),
        ("StrReplaceFile", {"path": "a.txt", "edit": {"old": "nowhere", "new": "q"}}, ""),
        ("WriteFile", {"path": "b.txt", "content": "one"}, ""),
        ("WriteFile", {"path": "b.txt", "content": "\ntwo", "mode": "append"}, ""),
        ("WriteFile", {"path": "missing/c.txt", "content": "c"}, ""),
        ("WriteFile", {"path": "../outside.txt", "content": "c"}, ""),
        ("ReadFile", {"path": "a.txt"}, ""),
    ])
    # Kimi reads with universal newlines and writes the text back as it is: the CRLFs become LFs
    assert (tmp_path / "a.txt").read_bytes() == b"z x\nw\n" and (tmp_path / "b.txt").read_text() == "one\ntwo"
    assert [r.returncode for r in runs] == [0, 0, 1, 0, 0, 1, 1]
    assert "not found" in runs[2].stderr and "parent directory does not exist" in runs[5].stderr
    assert not (tmp_path / "missing").exists() and not (tmp_path.parent / "outside.txt").exists()


def test_openhands_tools_replay_as_openhands_runs_them(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("a = 1\nb = 2\n")
    at = f"[Current working directory: {tmp_path}/sub]\n[Command finished with exit code 0]"
    runs = _run(tmp_path, "openhands", [
        ("terminal", {"command": "cd sub"}, at),
        ("terminal", {"command": "touch here"}, at),  # runs where the previous call ended
        ("file_editor", {"command": "str_replace", "path": f"{tmp_path}/a.py", "old_str": " b = 2\n ",
                         "new_str": "b = 3"}, ""),  # not found as given, found stripped
        ("file_editor", {"command": "insert", "path": f"{tmp_path}/a.py", "insert_line": 1, "new_str": "# c"}, ""),
        ("file_editor", {"command": "create", "path": f"{tmp_path}/a.py", "file_text": "x"}, ""),  # exists
        ("file_editor", {"command": "create", "path": f"{tmp_path}/new.py", "file_text": "n\n"}, ""),
        ("file_editor", {"command": "view", "path": f"{tmp_path}/a.py"}, ""),
        ("finish", {"message": "done"}, ""),
    ])
    assert (tmp_path / "sub" / "here").exists() and (tmp_path / "a.py").read_text() == "a = 1\n# c\nb = 3\n"
    assert [r.returncode for r in runs] == [0, 0, 0, 0, 1, 0] and (tmp_path / "new.py").read_text() == "n\n"
    (tmp_path / "latin.py").write_bytes(b"caf\xe9\n")
    (refused,) = _run(tmp_path, "openhands", [("file_editor", {
        "command": "insert", "path": f"{tmp_path}/latin.py", "insert_line": 0, "new_str": "x"}, "")])
    assert refused.returncode == 97 and REFUSED in refused.stdout


@pytest.mark.parametrize("harness, name, arguments, result, reason", [
    ("kimi-cli", "Agent", {"prompt": "go"}, "", "no exact replay"),
    ("kimi-cli", "Shell", {"command": "sleep 9", "run_in_background": True}, "", "in the background"),
    ("openhands", "file_editor", {"command": "undo_edit", "path": "/a"}, "", "history is not kept"),
    ("openhands", "terminal", {"command": "sleep 99"}, "[The command has no new output after 30 seconds.]",
     "does not say the directory"),
    ("openhands", "terminal", {"command": "C-c", "is_input": True}, "", "input to a running process"),
])
def test_calls_without_an_exact_replay_are_refused_before_a_sandbox_starts(harness, name, arguments, result, reason):
    with pytest.raises(UnreplayableCall, match=reason) as raised:
        harness_dialect(harness).replay(_rollout(harness, [("Shell" if harness == "kimi-cli" else "terminal",
                                                            {"command": "ls"}, "[Current working directory: /w]"),
                                                           (name, arguments, result)]), "/w")
    assert f"call c1 ({name}, step 3)" in str(raised.value)
