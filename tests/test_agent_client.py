"""`AgentSandbox` and `SyncSandbox` against the real agent, started as a subprocess on a Unix socket."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from orchard.core.errors import AuthError, InvalidRequest, NotFound, SandboxLost
from orchard.core.sandbox import Sandbox, ShellSession
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.sync import LoopThread, SyncSandbox
from tests.hang_guard import returns

AGENT_START_TIMEOUT_S = 20


@dataclass
class RunningAgent:
    process: subprocess.Popen
    socket_path: str
    token: str
    workdir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def sandbox(self, sandbox_id: str = "sb-test", **kwargs) -> AgentSandbox:
        return AgentSandbox(sandbox_id, self.url, self.token, workdir=str(self.workdir), **kwargs)

    def kill(self) -> None:
        """SIGKILL the agent's process group (it was started in its own session)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def _start_agent(workdir: Path, log: Path, socket_dir: str) -> RunningAgent:
    token = secrets.token_urlsafe(24)
    socket_path = os.path.join(socket_dir, "agent.sock")  # short: Unix socket paths are limited to 108 bytes
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchard.sandbox.agent", "--listen", f"unix:{socket_path}",
             "--workdir", str(workdir)],
            env={**os.environ, "ORCHARD_AGENT_TOKEN": token}, stdout=subprocess.PIPE, stderr=log_file,
            start_new_session=True)
    agent = RunningAgent(process, socket_path, token, workdir, log)
    first_line: list[bytes] = []
    reader = threading.Thread(target=lambda: first_line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(AGENT_START_TIMEOUT_S)
    if not first_line or not first_line[0].startswith(b"READY "):
        agent.kill()
        raise RuntimeError(f"the agent did not print READY within {AGENT_START_TIMEOUT_S} s "
                           f"(stdout: {first_line!r}):\n{log.read_text()}")
    return agent


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    workdir = tmp_path / "workspace"
    workdir.mkdir()
    socket_dir = tempfile.mkdtemp(prefix="oa-", dir=tempfile.gettempdir())
    running = _start_agent(workdir, tmp_path / "agent.log", socket_dir)
    try:
        yield running
    finally:
        running.kill()
        running.process.stdout.close()
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
async def sandbox(agent: RunningAgent):
    sb = agent.sandbox()
    try:
        yield sb
    finally:
        await sb.close()


class FaultyUnixProxy:
    """A real Unix-socket relay in front of the agent, to produce the two faults a client must tell apart:
    nothing listening yet (the connect fails, the request was never sent) and a connection dropped after
    the request was sent (the agent ran it; only the answer is lost)."""

    def __init__(self, listen_path: str, target_path: str, *, listen_after_s: float = 0.0,
                 drop_first_response: bool = False) -> None:
        self.listen_path, self.target_path = listen_path, target_path
        self.listen_after_s, self.drop_first_response = listen_after_s, drop_first_response
        self.connections = 0
        self.listening_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FaultyUnixProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _serve(self) -> None:
        time.sleep(self.listen_after_s)
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(self.listen_path)
            server.listen()
            server.settimeout(0.05)
            self.listening_since = time.monotonic()
            while not self._stop.is_set():
                try:
                    client, _ = server.accept()
                except socket.timeout:
                    continue
                self.connections += 1
                drop = self.drop_first_response and self.connections == 1
                threading.Thread(target=self._relay, args=(client, drop), daemon=True).start()

    def _relay(self, client: socket.socket, drop_response: bool) -> None:
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(self.target_path)
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        try:
            while data := upstream.recv(65536):
                if drop_response:  # the agent has answered, so it ran the request: lose the answer
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                _shut(sock)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _shut(sink)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: files by content and mode, links by target, directories by existence."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", path.read_bytes(), path.stat().st_mode & 0o777)
    return found


def _make_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    (root / "sub" / "deeper" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "sub" / "deeper" / "run.sh").chmod(0o755)
    (root / "link").symlink_to("sub/b.bin")


# -- exec and errors ---------------------------------------------------------------------------------------

async def test_exec_returns_output_exit_code_and_honours_cwd_env_stdin(sandbox: AgentSandbox, agent):
    assert isinstance(sandbox, Sandbox)
    result = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    (agent.workdir / "sub").mkdir()
    result = await sandbox.exec(["sh", "-c", "pwd; echo $GREETING; cat"], cwd="sub", env={"GREETING": "hi"},
                                stdin="from stdin")
    assert result.stdout == f"{agent.workdir / 'sub'}\nhi\nfrom stdin"
    assert result.ok


async def test_exec_timeout_is_a_result_not_an_error(sandbox: AgentSandbox):
    result = await returns(sandbox.exec("sleep 600", timeout=0.3), "an exec past its timeout")
    assert result.timed_out and result.exit_code is None


async def test_output_is_capped_at_max_output_bytes(sandbox: AgentSandbox):
    result = await sandbox.exec("head -c 100000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
    assert result.stdout_truncated and len(result.stdout) == 1000


async def test_wrong_token_raises_auth_error(agent: RunningAgent):
    async with AgentSandbox("sb-other", agent.url, "not-the-token") as wrong:
        with pytest.raises(AuthError):
            await wrong.exec("true")
        with pytest.raises(AuthError):
            await wrong.read_file("anything")


async def test_missing_file_raises_not_found(sandbox: AgentSandbox, tmp_path: Path):
    with pytest.raises(NotFound):
        await sandbox.read_file("does/not/exist.txt")
    with pytest.raises(NotFound):
        await sandbox.stat("does/not/exist.txt")
    with pytest.raises(NotFound):
        await sandbox.download("does/not/exist.txt", tmp_path / "x")


async def test_killed_agent_raises_sandbox_lost(agent: RunningAgent, sandbox: AgentSandbox):
    assert (await sandbox.exec("true")).ok
    agent.kill()
    with pytest.raises(SandboxLost) as lost:
        await returns(sandbox.exec("true"), "an exec on a killed agent")  # a few connect retries, then lost
    assert sandbox.id in str(lost.value) and "new sandbox" in str(lost.value)


async def test_agent_killed_during_a_request_raises_sandbox_lost(agent: RunningAgent, sandbox: AgentSandbox):
    running = asyncio.create_task(sandbox.exec("sleep 2"))
    await asyncio.sleep(0.3)
    agent.kill()
    with pytest.raises(SandboxLost):
        await asyncio.wait_for(running, 5)


async def test_connect_error_is_retried_without_running_the_command_twice(agent: RunningAgent):
    proxy_path = os.path.join(os.path.dirname(agent.socket_path), "late.sock")
    with FaultyUnixProxy(proxy_path, agent.socket_path, listen_after_s=0.15) as proxy:
        async with AgentSandbox("sb-late", f"unix://{proxy_path}", agent.token) as late:
            asked_at = time.monotonic()
            result = await late.exec("echo once >> retried.log")
    assert result.ok
    assert proxy.listening_since is not None and proxy.listening_since > asked_at  # first connect failed
    assert proxy.connections == 1
    assert (agent.workdir / "retried.log").read_text() == "once\n"


async def test_request_sent_then_connection_dropped_is_not_retried(agent: RunningAgent):
    proxy_path = os.path.join(os.path.dirname(agent.socket_path), "drop.sock")
    with FaultyUnixProxy(proxy_path, agent.socket_path, drop_first_response=True) as proxy:
        while proxy.listening_since is None:
            await asyncio.sleep(0.01)
        async with AgentSandbox("sb-drop", f"unix://{proxy_path}", agent.token) as dropping:
            with pytest.raises(SandboxLost):
                await dropping.exec("echo once >> side-effect.log")
    assert proxy.connections == 1
    assert (agent.workdir / "side-effect.log").read_text() == "once\n"


# -- files ---------------------------------------------------------------------------------------------------

async def test_write_read_stat_list_remove(sandbox: AgentSandbox, agent: RunningAgent):
    await sandbox.write_file("notes/hello.txt", "héllo\n", mode=0o600)
    await sandbox.write_file("notes/raw.bin", b"\x00\xff")
    assert (agent.workdir / "notes" / "hello.txt").read_text() == "héllo\n"
    assert await sandbox.read_file("notes/raw.bin") == b"\x00\xff"
    info = await sandbox.stat("notes/hello.txt")
    assert (info.size, info.is_dir, info.mode & 0o777) == (len("héllo\n".encode()), False, 0o600)
    assert sorted(e.name for e in await sandbox.list_dir("notes")) == ["hello.txt", "raw.bin"]
    await sandbox.remove("notes", recursive=True)
    assert not (agent.workdir / "notes").exists()


async def test_upload_and_download_a_file(sandbox: AgentSandbox, agent: RunningAgent, tmp_path: Path):
    source = tmp_path / "script.sh"
    source.write_bytes(b"#!/bin/sh\n" + os.urandom(2_000_000))
    source.chmod(0o755)
    await sandbox.upload(source, "in/script.sh")
    assert (agent.workdir / "in" / "script.sh").read_bytes() == source.read_bytes()
    assert (agent.workdir / "in" / "script.sh").stat().st_mode & 0o777 == 0o755
    back = tmp_path / "back" / "script.sh"
    await sandbox.download("in/script.sh", back)
    assert back.read_bytes() == source.read_bytes()
    assert back.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in back.parent.iterdir()] == ["script.sh"]  # no temp file left beside it


async def test_upload_and_download_a_directory_tree(sandbox: AgentSandbox, agent: RunningAgent, tmp_path: Path):
    tree = tmp_path / "tree"
    tree.mkdir()
    _make_tree(tree)
    await sandbox.upload(tree, "project")
    assert _snapshot(agent.workdir / "project") == _snapshot(tree)
    back = tmp_path / "back"
    await sandbox.download("project", back)
    assert _snapshot(back) == _snapshot(tree)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.log", "back", "tree", "workspace"]


async def test_download_merges_into_an_existing_directory(sandbox: AgentSandbox, tmp_path: Path):
    await sandbox.write_file("proj/new.txt", "new")
    await sandbox.write_file("proj/keep/changed.txt", "remote")
    local = tmp_path / "local"
    (local / "keep").mkdir(parents=True)
    (local / "keep" / "changed.txt").write_text("local")
    (local / "mine.txt").write_text("untouched")
    await sandbox.download("proj", local)
    assert {k: v[1] for k, v in _snapshot(local).items() if v[0] == "file"} == {
        "new.txt": b"new", "keep/changed.txt": b"remote", "mine.txt": b"untouched"}


async def test_download_refuses_a_tree_whose_link_points_outside(sandbox: AgentSandbox, agent: RunningAgent,
                                                                 tmp_path: Path):
    (agent.workdir / "evil").mkdir()
    (agent.workdir / "evil" / "ok.txt").write_text("fine")
    (agent.workdir / "evil" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(InvalidRequest):
        await sandbox.download("evil", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # temp extraction removed


async def test_upload_of_a_missing_local_path_raises_not_found(sandbox: AgentSandbox, tmp_path: Path):
    with pytest.raises(NotFound):
        await sandbox.upload(tmp_path / "missing", "x")


_RSS_PROBE = textwrap.dedent("""
    import asyncio, json, resource, sys
    from pathlib import Path
    from orchard.sandbox.agent_client import AgentSandbox

    def peak_kb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def main(url, token, big_file, big_dir, out):
        out = Path(out)
        async with AgentSandbox("sb-rss", url, token) as sb:
            # warm up every code path (imports, thread pool, tar worker) before measuring
            small = out / "small"
            small.mkdir()
            (small / "f").write_bytes(b"x" * 100_000)
            await sb.upload(small / "f", "warm/f")
            await sb.download("warm/f", out / "warm-f")
            await sb.upload(small, "warm-dir")
            await sb.download("warm-dir", out / "warm-dir")
            before = peak_kb()
            await sb.upload(big_file, "big.bin")
            await sb.download("big.bin", out / "big.bin")
            after_file = peak_kb()
            await sb.upload(big_dir, "bigdir")
            await sb.download("bigdir", out / "bigdir")
            after_dir = peak_kb()
        print(json.dumps({"before": before, "after_file": after_file, "after_dir": after_dir}))

    asyncio.run(main(*sys.argv[1:]))
""")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@pytest.mark.slow
def test_100mb_file_and_tree_transfers_keep_client_memory_flat(agent: RunningAgent, tmp_path: Path):
    """Measured in a fresh process, so the peak RSS (ru_maxrss) is the transfers' own, not an earlier test's.
    2-4 s here (400 MB moved, 500 MB hashed), more on a busy machine."""
    big_dir = tmp_path / "bigdir"
    big_dir.mkdir()
    block = os.urandom(1 << 20)
    with open(big_dir / "payload.bin", "wb") as f:
        for i in range(100):
            f.write(block[i:] + block[:i])  # 100 distinct MiB
    big_file = tmp_path / "big.bin"
    os.link(big_dir / "payload.bin", big_file)
    out = tmp_path / "out"
    out.mkdir()
    try:
        probe = subprocess.run([sys.executable, "-c", _RSS_PROBE, agent.url, agent.token, str(big_file),
                                str(big_dir), str(out)], capture_output=True, text=True, timeout=240)
        assert probe.returncode == 0, probe.stderr
        peaks = json.loads(probe.stdout)
        expected = _sha256(big_file)
        assert _sha256(agent.workdir / "big.bin") == expected and _sha256(out / "big.bin") == expected
        assert _sha256(agent.workdir / "bigdir" / "payload.bin") == expected
        assert _sha256(out / "bigdir" / "payload.bin") == expected
        assert (peaks["after_file"] - peaks["before"]) < 30_000, peaks  # KiB: far below the 100 MiB moved
        assert (peaks["after_dir"] - peaks["before"]) < 30_000, peaks
    finally:  # 400 MB of copies: do not leave them in pytest's kept temp dirs
        for root in (big_dir, out, agent.workdir):
            shutil.rmtree(root, ignore_errors=True)
        big_file.unlink(missing_ok=True)


# -- streaming and shells --------------------------------------------------------------------------------

async def test_exec_stream_yields_output_as_it_comes_then_the_exit(sandbox: AgentSandbox, agent: RunningAgent):
    # the command goes on only once the test has seen its first line: were output not streamed, it would
    # run into its timeout (no exit code 4)
    go = agent.workdir / "stream-go"
    command = f"echo first; echo oops >&2; while [ ! -e {go} ]; do sleep 0.02; done; echo second; exit 4"
    events = []
    async for event in sandbox.exec_stream(command, timeout=60):
        events.append(event)
        go.touch()
    assert "".join(e.data for e in events if e.kind == "stdout") == "first\nsecond\n"
    assert "".join(e.data for e in events if e.kind == "stderr") == "oops\n"
    assert events[-1].kind == "exit" and events[-1].result.exit_code == 4
    assert [e.kind for e in events].count("exit") == 1


async def test_shell_session_keeps_state_times_out_and_recovers(sandbox: AgentSandbox, agent: RunningAgent):
    (agent.workdir / "deep").mkdir()
    shell = await sandbox.shell("main", env={"START": "yes"})
    assert isinstance(shell, ShellSession)
    assert (await shell.run("cd deep && export COLOR=green && x=1")).exit_code == 0
    result = await shell.run("pwd; echo $COLOR $x $START; false")
    assert result.output == f"{agent.workdir / 'deep'}\ngreen 1 yes\n" and result.exit_code == 1
    timed = await shell.run("sleep 20", timeout=0.3)
    assert timed.timed_out
    assert (await shell.run("echo $COLOR")).output == "green\n"
    assert "main" in await sandbox.list_sessions()
    await shell.close()
    with pytest.raises(NotFound):
        await shell.run("true")


async def test_shell_interrupt_stops_the_running_command(sandbox: AgentSandbox):
    shell = await sandbox.shell("busy")
    running = asyncio.create_task(shell.run("sleep 30"))
    await asyncio.sleep(0.3)
    await shell.interrupt()
    result = await asyncio.wait_for(running, 5)
    assert result.exit_code != 0
    assert (await shell.run("echo alive")).output == "alive\n"
    with pytest.raises(InvalidRequest):
        await sandbox.shell("busy")  # the name is taken
    await shell.close()


# -- lifecycle and the sync wrapper ----------------------------------------------------------------------

async def test_close_runs_on_close_once_and_then_refuses_calls(agent: RunningAgent):
    closes = []

    async def on_close() -> None:
        closes.append(1)

    async with agent.sandbox(on_close=on_close) as sb:
        assert (await sb.exec("true")).ok
    await sb.close()
    assert closes == [1]
    with pytest.raises(InvalidRequest):
        await sb.exec("true")


def test_sync_sandbox_offers_the_same_calls(agent: RunningAgent, tmp_path: Path):
    closes = []

    async def on_close() -> None:
        closes.append(1)

    loop = LoopThread(name="test-loop")
    try:
        with SyncSandbox(agent.sandbox(on_close=on_close), loop) as sb:
            assert sb.exec("echo $A", env={"A": "sync"}).stdout == "sync\n"
            assert [e.kind for e in sb.exec_stream("echo x")][-1] == "exit"
            stream = sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.1; done")
            assert next(stream).data == "1\n"
            stream.close()  # leaving early closes the async stream too
            sb.write_file("s.txt", "sync write")
            assert sb.read_file("s.txt") == b"sync write"
            assert sb.stat("s.txt").size == len("sync write")
            assert [e.name for e in sb.list_dir(".")] == ["s.txt"]
            tree = tmp_path / "tree"
            tree.mkdir()
            _make_tree(tree)
            sb.upload(tree, "tree")
            sb.download("tree", tmp_path / "tree-back")
            assert _snapshot(tmp_path / "tree-back") == _snapshot(tree)
            with sb.shell("s", cwd="tree") as shell:
                assert shell.run("cat a.txt").output == "alpha\n"
                with pytest.raises(NotFound):
                    sb.read_file("nope")
        assert closes == [1]
    finally:
        loop.close()


def test_loop_thread_refuses_to_block_its_own_loop():
    loop = LoopThread()
    try:
        async def nested() -> None:
            loop.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="own loop"):
            loop.run(nested())
        assert loop.run(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()
