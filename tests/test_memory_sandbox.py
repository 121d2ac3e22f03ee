"""The in-memory Sandbox double (orchard/testing/memory_sandbox.py): it speaks the Sandbox protocol, answers
commands only from what the test scripted or from its own files, never pretends to run anything else, and
records every call."""

from __future__ import annotations

import pytest

from orchard.core.errors import NotFound, SandboxLost
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.testing.memory_sandbox import NOT_SCRIPTED, MemorySandbox


async def test_it_is_a_sandbox_answering_from_its_files_and_the_script():
    sandbox = MemorySandbox(files={"README.md": "hi\n", "pkg/mod.py": "x = 1\n"},
                            answers={"python -m pytest -q": ExecResult(exit_code=1, stdout="1 failed\n")},
                            answer=lambda request: "ran\n" if request.command == ["make", "test"] else None)
    assert isinstance(sandbox, Sandbox)
    assert (await sandbox.exec("cat README.md pkg/mod.py")).stdout == "hi\nx = 1\n"
    assert (await sandbox.exec("ls")).stdout == "README.md\npkg\n"
    assert (await sandbox.exec("ls", cwd="pkg")).stdout == "mod.py\n"
    assert (await sandbox.exec(["echo", "a b"])).stdout == "a b\n"
    assert (await sandbox.exec("python -m pytest -q")).exit_code == 1
    assert (await sandbox.exec(["make", "test"])).stdout == "ran\n"
    missing = await sandbox.exec("cat nope.txt")
    assert missing.exit_code == 1 and "No such file" in missing.stderr
    unscripted = await sandbox.exec("grep -r x . | wc -l")  # shell syntax: nothing is run, and it says so
    assert unscripted.exit_code == NOT_SCRIPTED and "no answer scripted" in unscripted.stderr
    events = [event async for event in sandbox.exec_stream("cat README.md")]
    assert [(event.kind, event.data) for event in events[:-1]] == [("stdout", "hi\n")]
    assert events[-1].kind == "exit" and events[-1].result.exit_code == 0
    assert (await sandbox.exec("echo " + "y" * 50, max_output_bytes=10)).stdout_truncated
    assert sandbox.commands[:2] == ["cat README.md pkg/mod.py", "ls"]


async def test_files_directories_and_trees(tmp_path):
    sandbox = MemorySandbox()
    await sandbox.write_file("out/a.txt", b"\x00\xff", mode=0o600)
    assert await sandbox.read_file("/workspace/out/a.txt") == b"\x00\xff"
    info = await sandbox.stat("out/a.txt")
    assert (info.size, info.mode, info.is_dir) == (2, 0o600, False) and (await sandbox.stat("out")).is_dir
    assert [item.name for item in await sandbox.list_dir(".")] == ["out"]
    for call in (sandbox.read_file("nope"), sandbox.stat("nope"), sandbox.list_dir("nope")):
        with pytest.raises(NotFound):
            await call
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "b.txt").write_text("b")
    await sandbox.upload(tmp_path / "tree", "up")
    await sandbox.download("up", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "b.txt").read_text() == "b"
    session = await sandbox.shell()
    assert (await session.run("cat up/sub/b.txt")).output == "b"


async def test_a_lost_sandbox_raises_on_every_call_and_every_call_is_recorded():
    sandbox = MemorySandbox()
    await sandbox.exec("true")
    sandbox.lose("the node went away")
    with pytest.raises(SandboxLost, match="the node went away"):
        await sandbox.exec("true")
    with pytest.raises(SandboxLost):
        await sandbox.read_file("x")
    assert [call.method for call in sandbox.calls] == ["exec", "exec", "read_file"]
    assert sandbox.calls[0].arguments["command"] == "true"
