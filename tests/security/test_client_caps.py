"""A sandbox must not be able to exhaust or subvert the client that reads from it (security issue #8, the
client-SDK items): `read_file` and `download` are capped (a 3 GB sparse file costs a sandbox nothing), a
refused download leaves nothing behind, and what a download writes on this machine is plain data (no
setuid/setgid/sticky bits, no owners, no device nodes or FIFOs).

The attacks run in real sandboxes of the embedded local backend. An agent that ignores the caps or sends a
hostile stream cannot be had from the real agent (it honours them), so `LyingAgent` below is a fake, named
as such: a minimal HTTP/1.1 server on a Unix socket that answers what a compromised agent would."""

from __future__ import annotations

import io
import os
import resource
import socket
import stat
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

from orchard.core.errors import InvalidRequest, NotFound, OrchardError, PayloadTooLarge
from orchard.sandbox.agent_client import DOWNLOAD_MAX_BYTES, READ_FILE_MAX_BYTES, AgentSandbox
from orchard.sandbox.client import AsyncOrchard, Orchard

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture
def home(embedded_home) -> Path:
    return embedded_home  # conftest.py's: one home for the module, for the embedded client


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _leftovers(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def _special_bits(path: Path) -> int:
    return path.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)


# -- caps against a real sandbox -----------------------------------------------------------------------------

async def test_a_3gb_sparse_file_cannot_grow_the_client_or_fill_its_disk(home, tmp_path):
    assert READ_FILE_MAX_BYTES == 64 * MIB and DOWNLOAD_MAX_BYTES == GIB
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create()
        made = await sandbox.exec("truncate -s 3G big.bin && mkdir tree && echo small > tree/a.txt && "
                                  "truncate -s 3G tree/b.bin && head -c 2000000 /dev/urandom > two-mb.bin")
        assert made.exit_code == 0, made.stderr
        peak_before = _peak_rss_bytes()

        # read_file: the agent refuses before sending, naming the size; the default cap applies.
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.read_file("big.bin")
        assert str(3 * GIB) in str(refused.value) and "max_bytes" in str(refused.value)
        # An explicit cap below a file's size refuses it too; at or above it, the file is read.
        with pytest.raises(PayloadTooLarge):
            await sandbox.read_file("two-mb.bin", max_bytes=MIB)
        assert len(await sandbox.read_file("two-mb.bin", max_bytes=2_000_000)) == 2_000_000

        # download of one file: refused from its size before a byte is written.
        out = tmp_path / "out"
        out.mkdir()
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.download("big.bin", out / "big.bin")
        assert str(3 * GIB) in str(refused.value) and "Nothing was written" in str(refused.value)
        # download of a tree holding it: refused at that member's header; the small file extracted before
        # it is removed with the rest, and the destination never appears.
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.download("tree", out / "tree")
        assert "b.bin" in str(refused.value)
        with pytest.raises(PayloadTooLarge):  # and an explicit cap below a tree's data
            await sandbox.download(".", out / "all", max_bytes=MIB)
        assert _leftovers(out) == []

        # Nothing like 3 GB (or 64 MiB) ever came into this process.
        assert _peak_rss_bytes() - peak_before < 32 * MIB
        # What fits still works, and the sandbox is fine.
        await sandbox.download("two-mb.bin", out / "two-mb.bin", max_bytes=2_000_000)
        assert (out / "two-mb.bin").stat().st_size == 2_000_000
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"


def test_the_sync_sdk_has_the_same_caps(home, tmp_path):
    with Orchard(home=home) as orch, orch.create() as sandbox:
        assert sandbox.exec("truncate -s 3G big.bin && echo 12345 > small.txt").exit_code == 0
        with pytest.raises(PayloadTooLarge):
            sandbox.read_file("big.bin")
        with pytest.raises(PayloadTooLarge):
            sandbox.read_file("small.txt", max_bytes=5)
        assert sandbox.read_file("small.txt", max_bytes=6) == b"12345\n"
        with pytest.raises(PayloadTooLarge):
            sandbox.download("big.bin", tmp_path / "big.bin")
        with pytest.raises(PayloadTooLarge):
            sandbox.download("small.txt", tmp_path / "small.txt", max_bytes=5)
        assert _leftovers(tmp_path) == []


async def test_a_tree_of_endless_empty_files_is_stopped_by_the_stream_cap(home, tmp_path):
    """Empty files carry no file data, but each costs a tar header: the raw stream is capped as well."""
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create()
        made = await sandbox.exec("mkdir many && cd many && seq 3000 | xargs touch")
        assert made.exit_code == 0, made.stderr
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.download("many", tmp_path / "many", max_bytes=0)
        assert "tar stream" in str(refused.value)
        assert _leftovers(tmp_path) == []


# -- what a download writes on this machine --------------------------------------------------------------------

async def test_downloads_drop_setuid_setgid_sticky_and_group_write(home, tmp_path):
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create()
        made = await sandbox.exec("mkdir -p d/sub && printf '#!/bin/sh\\n' > d/suid && chmod 6777 d/suid && "
                                  "chmod 3777 d/sub d && cp d/suid one-suid && chmod 6777 one-suid && "
                                  "stat -c %a d d/sub d/suid one-suid")
        assert made.stdout.split() == ["3777", "3777", "6777", "6777"], made.stdout + made.stderr
        await sandbox.download("d", tmp_path / "d")
        await sandbox.download("one-suid", tmp_path / "one-suid")
        for path in (tmp_path / "d", tmp_path / "d" / "sub", tmp_path / "d" / "suid", tmp_path / "one-suid"):
            assert _special_bits(path) == 0, path
            assert path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH) == 0, path
        assert (tmp_path / "d" / "suid").stat().st_mode & 0o777 == 0o755  # still executable
        assert (tmp_path / "one-suid").stat().st_mode & 0o777 == 0o755


async def test_a_download_with_a_fifo_is_refused_and_writes_nothing(home, tmp_path):
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create()
        assert (await sandbox.exec("mkdir p && echo x > p/a && mkfifo p/pipe")).exit_code == 0
        with pytest.raises(InvalidRequest) as refused:
            await sandbox.download("p", tmp_path / "p")
        assert "pipe" in str(refused.value) and "FIFO" in str(refused.value)
        assert _leftovers(tmp_path) == []


# -- a lying agent (a fake: see the module docstring) -------------------------------------------------------

class LyingAgent:
    """A fake agent on a Unix socket that ignores `max_bytes`: `routes` maps a path (without the query) to
    (headers, body chunks) it answers with, or (headers, body chunks, status line) for another status.
    `started` counts, per path, the body bytes it began to send (counted before each send, so a client that
    read a whole answer has always seen the full count); a client that stops reading keeps it far below a
    big answer's size, which cannot sit in the socket's buffers."""

    def __init__(self, routes: dict) -> None:
        self.dir = tempfile.mkdtemp(prefix="lying-", dir=tempfile.gettempdir())
        self.socket_path = os.path.join(self.dir, "agent.sock")
        self.routes = routes
        self.started: dict[str, int] = {}
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(self.socket_path)
        self._server.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def sandbox(self) -> AgentSandbox:
        return AgentSandbox("sb-lying", f"unix://{self.socket_path}", "token")

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rfile:
            while True:
                request_line = rfile.readline()
                if not request_line:
                    return
                while rfile.readline() not in (b"\r\n", b""):
                    pass
                path = request_line.split()[1].decode().split("?")[0]
                headers, chunks, status = (*self.routes[path], "200 OK")[:3]
                try:
                    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                    conn.sendall(f"HTTP/1.1 {status}\r\n{head}\r\n".encode())
                    for chunk in chunks():
                        self.started[path] = self.started.get(path, 0) + len(chunk)
                        conn.sendall(chunk)
                except OSError:  # the client hung up: what a capped client does
                    return

    def close(self) -> None:
        self._server.close()
        os.unlink(self.socket_path)
        os.rmdir(self.dir)


def _chunked(total: int, piece: bytes = b"\0" * MIB):
    def chunks():
        sent = 0
        while sent < total:
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
            sent += len(piece)
        yield b"0\r\n\r\n"
    return chunks


def _stat(size: int, is_dir: bool = False):
    body = (b'{"path":"/w/x","name":"x","exists":true,"is_dir":%s,"is_symlink":false,"size":%d,"mode":420,'
            b'"mtime":0}' % (b"true" if is_dir else b"false", size))
    return {"Content-Type": "application/json", "Content-Length": str(len(body))}, lambda: [body]


CHUNKED = {"Transfer-Encoding": "chunked"}


@pytest.fixture
def lying():
    agents = []

    def make(routes: dict) -> AgentSandbox:
        agents.append(LyingAgent(routes))
        sandbox = agents[-1].sandbox()
        sandbox.fake = agents[-1]
        return sandbox

    yield make
    for agent in agents:
        agent.close()


async def test_read_file_enforces_its_cap_on_the_stream_when_the_agent_ignores_it(lying):
    # Sends 256 MiB whatever max_bytes says: without the client's own count, read_file would return it all.
    sandbox = lying({"/files": (CHUNKED, _chunked(256 * MIB))})
    async with sandbox:
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.read_file("x", max_bytes=MIB)
        assert "more arrived" in str(refused.value)
    assert sandbox.fake.started["/files"] < 64 * MIB  # of 256 MiB


async def test_read_file_refuses_an_announced_size_over_its_cap_before_reading(lying):
    sandbox = lying({"/files": ({"Content-Length": str(10 * GIB)}, lambda: [b"\0" * MIB])})
    async with sandbox:
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.read_file("x")
        assert str(10 * GIB) in str(refused.value)


async def test_a_compressed_body_is_refused_rather_than_inflated(lying):
    import gzip

    bomb = gzip.compress(b"\0" * (64 * MIB))  # ~64 KiB that would inflate past the cap
    sandbox = lying({"/files": ({"Content-Length": str(len(bomb)), "Content-Encoding": "gzip"}, lambda: [bomb])})
    async with sandbox:
        with pytest.raises(OrchardError) as refused:
            await sandbox.read_file("x", max_bytes=MIB)
        assert "Content-Encoding" in str(refused.value)


async def test_an_endless_error_body_is_not_read_whole(lying):
    sandbox = lying({"/files": (CHUNKED, _chunked(256 * MIB), "404 Not Found")})
    async with sandbox:
        with pytest.raises(NotFound) as refused:
            await sandbox.read_file("x", max_bytes=MIB)
        assert "without an error body" in str(refused.value)
    assert sandbox.fake.started["/files"] < 64 * MIB  # of 256 MiB


async def test_download_stops_a_file_larger_than_its_stat_and_removes_the_partial_file(lying, tmp_path):
    sandbox = lying({"/files/stat": _stat(10), "/files": (CHUNKED, _chunked(256 * MIB))})
    async with sandbox:
        with pytest.raises(PayloadTooLarge):
            await sandbox.download("x", tmp_path / "x", max_bytes=4 * MIB)
    assert _leftovers(tmp_path) == []
    assert sandbox.fake.started["/files"] < 64 * MIB  # of 256 MiB


def _tar_stream(*members: tarfile.TarInfo, data: bytes = b"", endless_zeros: bool = False):
    def chunks():
        buf = io.BytesIO()
        for member in members:
            buf.write(member.tobuf(tarfile.PAX_FORMAT))
            if member.isreg() and 0 < member.size <= len(data):  # a larger one is followed by the zeros
                buf.write(data[:member.size].ljust(-(-member.size // 512) * 512, b"\0"))
        payload = buf.getvalue()
        yield b"%x\r\n%s\r\n" % (len(payload), payload)
        piece = b"\0" * MIB
        for _ in range(256 if endless_zeros else 0):
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
        yield b"0\r\n\r\n"
    return chunks


def _member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, size, mode
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info


async def test_download_refuses_a_tar_member_declaring_more_than_the_cap(lying, tmp_path):
    stream = _tar_stream(_member("ok.txt", size=3), _member("huge.bin", size=5 * GIB), data=b"abc",
                         endless_zeros=True)
    sandbox = lying({"/files/stat": _stat(0, is_dir=True), "/tar": ({"Content-Type": "application/x-tar",
                                                                      **CHUNKED}, stream)})
    async with sandbox:
        with pytest.raises(PayloadTooLarge) as refused:
            await sandbox.download("d", tmp_path / "d")
        assert "huge.bin" in str(refused.value)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
async def test_download_refuses_device_nodes_and_fifos(lying, tmp_path, kind):
    stream = _tar_stream(_member("ok.txt", size=3), _member("dev-null", kind=kind), data=b"abc")
    sandbox = lying({"/files/stat": _stat(0, is_dir=True), "/tar": (CHUNKED, stream)})
    async with sandbox:
        with pytest.raises(InvalidRequest) as refused:
            await sandbox.download("d", tmp_path / "d")
        assert "dev-null" in str(refused.value) and "device node" in str(refused.value)
    assert _leftovers(tmp_path) == []


async def test_download_never_applies_setuid_bits_or_owners_from_the_stream(lying, tmp_path):
    suid = _member("suid", size=3, mode=0o6755)
    suid.uid, suid.gid, suid.uname, suid.gname = 12345, 12345, "", ""  # applied only by a root extractor
    sticky_dir = _member("shared", kind=tarfile.DIRTYPE, mode=0o3777)
    stream = _tar_stream(sticky_dir, suid, data=b"abc")
    sandbox = lying({"/files/stat": _stat(0, is_dir=True), "/tar": (CHUNKED, stream)})
    async with sandbox:
        await sandbox.download("d", tmp_path / "d")
    assert _special_bits(tmp_path / "d" / "suid") == 0 and _special_bits(tmp_path / "d" / "shared") == 0
    extracted = (tmp_path / "d" / "suid").stat()
    assert (extracted.st_uid, extracted.st_gid) == (os.getuid(), os.getgid())


# -- the CLI: `orchard sandbox cp` out of a sandbox, through a real `orchard serve` ---------------------------

def test_cli_cp_out_of_a_sandbox_is_capped_and_writes_plain_data(tmp_path_factory, tmp_path):
    from typer.testing import CliRunner

    from orchard.cli.main import app
    from tests.running_server import running_server

    runner = CliRunner()
    with running_server(tmp_path_factory.mktemp("caps-server-home"), "caps-key-0123456789") as server:
        env = {"ORCHARD_URL": server.url, "ORCHARD_API_KEY": server.api_key}

        def orchard(*args: str):
            result = runner.invoke(app, list(args), env=env)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            return result

        sandbox_id = orchard("sandbox", "create").stdout.strip()
        made = orchard("sandbox", "exec", sandbox_id, "--",
                       "mkdir d && echo hi > d/suid && chmod 6777 d/suid && chmod 3777 d && truncate -s 3G big")
        assert made.exit_code == 0, made.stderr

        too_big = orchard("sandbox", "cp", f"{sandbox_id}:big", str(tmp_path / "big"))
        assert too_big.exit_code == 1 and "max_bytes" in " ".join(too_big.stderr.split())
        capped = orchard("sandbox", "cp", "--max-bytes", "2", f"{sandbox_id}:d", str(tmp_path / "d"))
        assert capped.exit_code == 1 and "max_bytes=2" in " ".join(capped.stderr.split())
        assert _leftovers(tmp_path) == []

        copied = orchard("sandbox", "cp", f"{sandbox_id}:d", str(tmp_path / "d"))
        assert copied.exit_code == 0, copied.stderr
        assert _special_bits(tmp_path / "d") == 0 and _special_bits(tmp_path / "d" / "suid") == 0
        assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
        assert (tmp_path / "d" / "suid").stat().st_mode & 0o777 == 0o755
        orchard("sandbox", "rm", sandbox_id)
