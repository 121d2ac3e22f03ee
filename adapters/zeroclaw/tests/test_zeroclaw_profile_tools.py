"""The profile's tools in a real sandbox (Orchard's embedded orchestrator, the local backend): each answers as
ZeroClaw 0.8.4's does, mistakes come back as `Error: ...`, and only a failing sandbox raises."""

from __future__ import annotations

import json

import pytest

from orchard.sandbox.client import AsyncOrchard
from orchard.testing.memory_sandbox import MemorySandbox
from orchard_zeroclaw.profile.config import ProfileConfig
from orchard_zeroclaw.profile.text import glob_regex
from orchard_zeroclaw.profile.tools import (MEMORY_PATH, ProfileTools, SandboxCallFailed,
                                            truncate_tool_result)

WORKDIR = "/workspace"


@pytest.fixture
async def sandbox(tmp_path):
    async with AsyncOrchard(home=tmp_path / "home") as orch:
        made = await orch.create(image="host", workdir=WORKDIR)
        try:
            await made.exec(["sh", "-c", "mkdir -p src/pkg && printf 'one\\ntwo\\nthree\\nfour\\nfive\\n' > five.txt"
                                         " && printf 'def main():\\n    return 1\\n' > src/pkg/app.py"
                                         " && printf 'import app\\n' > src/run.py && printf '\\0\\1' > blob.bin"],
                            cwd=WORKDIR)
            yield made
        finally:
            await made.close()


def tools(sandbox, **config) -> ProfileTools:
    return ProfileTools(sandbox, WORKDIR, ProfileConfig(**config))


async def answer(sandbox, name, **arguments):
    result = await tools(sandbox).call(name, arguments)
    return result.text, result.ok


async def test_shell_answers_as_zeroclaw_does(sandbox):
    assert await answer(sandbox, "shell", command="echo out; echo err >&2") == ("out\n", True)  # stderr dropped
    assert await answer(sandbox, "shell", command="true") == ("(no output)", True)
    assert await answer(sandbox, "shell", command="echo out; echo bad >&2; exit 3") == ("Error: bad\n", False)
    assert await answer(sandbox, "shell", command="echo only-out; exit 1") == ("Error: only-out\n", False)
    slow = await tools(sandbox, shell_timeout_s=1).call("shell", {"command": "sleep 20"})
    assert (slow.text, slow.ok) == ("Error: Command timed out after 1s and was killed", False)
    assert await answer(sandbox, "shell") == ("Error: executing shell: Missing 'command' parameter", False)


async def test_file_read_numbers_lines_and_says_how_many(sandbox):
    text, ok = await answer(sandbox, "file_read", path="five.txt")
    assert ok and text == "1: one\n2: two\n3: three\n4: four\n5: five\n[5 lines total]"
    part = await answer(sandbox, "file_read", path="five.txt", offset=2, limit=2)
    assert part == ("2: two\n3: three\n[Lines 2-3 of 5]", True)
    assert (await answer(sandbox, "file_read", path="five.txt", offset=9))[0] == "[No lines in range, file has 5 lines]"
    assert await answer(sandbox, "file_read", path="nope.txt") == (
        "Error: Failed to read file: No such file or directory (os error 2)", False)
    assert (await answer(sandbox, "file_read", path="blob.bin"))[0] == "Error: blob.bin is a binary file; file_read " \
                                                                         "reads text files only"
    assert await answer(sandbox, "file_read", path="/etc/hostname") == (
        "Error: Path escapes workspace directory: /etc/hostname", False)
    assert (await tools(sandbox, workspace_only=False).call("file_read", {"path": "/etc/hostname"})).ok


async def test_file_write_and_file_edit(sandbox):
    assert await answer(sandbox, "file_write", path="new/dir/note.md", content="héllo\n") == (
        "Written 7 bytes to new/dir/note.md", True)  # bytes, and the directories made
    assert await sandbox.read_file(f"{WORKDIR}/new/dir/note.md") == "héllo\n".encode()
    assert await answer(sandbox, "file_edit", path="new/dir/note.md", old_string="héllo", new_string="bye") == (
        "Edited new/dir/note.md: replaced 1 occurrence (4 bytes)", True)
    assert await answer(sandbox, "file_edit", path="new/dir/note.md", old_string="zzz", new_string="y") == (
        "Error: old_string not found in file", False)
    await sandbox.write_file(f"{WORKDIR}/twice.txt", "a\na\n")
    assert await answer(sandbox, "file_edit", path="twice.txt", old_string="a", new_string="b") == (
        "Error: old_string matches 2 times; must match exactly once", False)
    text, ok = await answer(sandbox, "file_edit", path="src/pkg/app.py", old_string="return 1", new_string="x")
    assert ok
    text, ok = await answer(sandbox, "file_edit", path="src/pkg/app.py", old_string="def main():\nx",
                            new_string="y")
    assert not ok and "ignoring leading whitespace exists exactly once" in text
    assert await answer(sandbox, "file_edit", path="twice.txt", old_string="", new_string="b") == (
        "Error: old_string must not be empty", False)


async def test_glob_and_content_search(sandbox):
    assert await answer(sandbox, "glob_search", pattern="**/*.py") == (
        "src/pkg/app.py\nsrc/run.py\n\nTotal: 2 files", True)
    assert await answer(sandbox, "glob_search", pattern="src/*.py") == ("src/run.py\n\nTotal: 1 files", True)
    assert await answer(sandbox, "glob_search", pattern="*.rs") == (
        "No files matching pattern '*.rs' found in workspace.", True)
    assert (await answer(sandbox, "glob_search", pattern="../*"))[0].startswith("Error: Path traversal")
    assert glob_regex("a/**/b?.[!x]y").fullmatch("a/c/d/b1.zy") and not glob_regex("*.py").fullmatch("d/e.py")

    assert await answer(sandbox, "content_search", pattern="def main", path="src") == (
        "src/pkg/app.py:1:def main():\n\nTotal: 1 matching lines in 1 files", True)
    listed, ok = await answer(sandbox, "content_search", pattern="import|def", output_mode="files_with_matches",
                              include="*.py")
    assert ok and set(listed.split("\n\n")[0].splitlines()) == {"src/pkg/app.py", "src/run.py"}  # grep's order
    assert listed.endswith("\n\nTotal: 2 files")
    assert await answer(sandbox, "content_search", pattern="o", path="five.txt", output_mode="count") == (
        "five.txt:3\n\nTotal: 3 matches in 1 files", True)
    assert await answer(sandbox, "content_search", pattern="ZZZ") == ("No matches found.", True)
    assert await answer(sandbox, "content_search", pattern="x", path="missing") == (
        "Error: Cannot resolve path 'missing': No such file or directory (os error 2)", False)


async def test_memory_lives_in_the_sandbox_outside_the_workdir(sandbox):
    assert await answer(sandbox, "memory_store", key="lang", content="the project is in Python") == (
        "Stored memory: lang", True)
    assert await answer(sandbox, "memory_store", key="db", content="sqlite for tests", category="daily") == (
        "Stored memory: db", True)
    assert await answer(sandbox, "memory_recall", query="python project") == (
        "Found 1 memories:\n- [core] lang: the project is in Python [100%]\n", True)
    assert await answer(sandbox, "memory_recall") == (
        "Found 2 memories:\n- [daily] db: sqlite for tests\n- [core] lang: the project is in Python\n", True)
    assert await answer(sandbox, "memory_forget", key="db") == ("Forgot memory: db", True)
    assert await answer(sandbox, "memory_forget", key="db") == ("No memory found with key: db", True)
    assert await answer(sandbox, "memory_recall", query="sqlite") == ("No memories found.", True)
    assert [entry["key"] for entry in json.loads(await sandbox.read_file(MEMORY_PATH))] == ["lang"]
    assert not MEMORY_PATH.startswith(WORKDIR)


async def test_todo_write_checks_the_list():
    memory = MemorySandbox()
    todos = [{"content": "read", "status": "completed"}, {"content": "fix", "status": "in_progress"}]
    assert await answer(memory, "TodoWrite", todos=todos) == ("2 todos tracked (1 done)", True)
    assert await answer(memory, "TodoWrite", todos=[{"content": "x", "status": "later"}]) == (
        "Error: todo 0: invalid status 'later'; use one of pending, in_progress, completed", False)


async def test_long_results_keep_their_head_and_tail(sandbox):
    result = await tools(sandbox, max_tool_result_chars=300).call("shell", {"command": "seq 1 2000"})
    assert result.ok and len(result.text) < 400 and result.text.startswith("1\n2\n") and result.text.endswith("2000\n")
    assert "characters truncated ...]" in result.text
    assert truncate_tool_result("abc", 300) == "abc"


async def test_a_lost_sandbox_raises_and_a_model_mistake_does_not():
    memory = MemorySandbox()
    memory.lose("gone")
    with pytest.raises(SandboxCallFailed, match="sandbox failed"):
        await tools(memory).call("shell", {"command": "ls"})
    with pytest.raises(SandboxCallFailed):
        await tools(memory).call("file_read", {"path": "a.txt"})
