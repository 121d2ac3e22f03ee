"""The SDK end to end on real sandboxes: embedded (in-process orchestrator, local backend) and remote (a real
`orchard serve` subprocess), sync and async."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import orchard
from orchard.core.errors import AuthError, BackendError, InvalidRequest, NotFound, OrchardError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.client import AsyncOrchard, Orchard
from tests.hang_guard import returns
from tests.running_server import free_port, live_sandbox_ids, running_server

API_KEY = "test-key-0123456789"


@pytest.fixture
def home(embedded_home) -> Path:
    return embedded_home  # conftest.py's: one home for the module, for the embedded client


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("server-home"), API_KEY) as running:
        yield running


async def assert_gone(home: Path, sandbox_id: str) -> None:
    """No process of the sandbox runs, and the orchestrator's record (if kept) says deleted."""
    assert sandbox_id not in await live_sandbox_ids(home)
    async with AsyncOrchard(home=home) as orch:
        try:
            assert (await orch.get(sandbox_id)).state == "deleted"
        except NotFound:
            pass  # a sandbox deleted by stopping the orchestrator leaves no record


def test_public_names_are_exported_lazily():
    code = "import sys, orchard; assert 'orchard.sandbox.client' not in sys.modules; print(orchard.Orchard)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "orchard.sandbox.client.Orchard" in out
    assert orchard.AsyncOrchard is AsyncOrchard and orchard.SandboxSpec is SandboxSpec


# --- embedded ------------------------------------------------------------------------------------------


async def test_embedded_async_end_to_end(home):
    async with AsyncOrchard() as orch:
        assert orch.embedded
        sandbox = await orch.create(image="host", env={"GREETING": "hi"}, labels={"t": "e2e"})
        result = await sandbox.exec("echo $GREETING; pwd")
        assert result.exit_code == 0 and result.stdout == "hi\n/workspace\n"
        await sandbox.write_file("a/b.txt", b"data")
        assert await sandbox.read_file("a/b.txt") == b"data"
        info = await orch.get(sandbox.id)
        assert info.state == "ready" and info.spec.labels == {"t": "e2e"}
        assert sandbox.id in [s.id for s in await orch.list(labels={"t": "e2e"})]
        assert (await orch.heartbeat(sandbox.id)).last_heartbeat >= info.last_heartbeat
    await assert_gone(home, sandbox.id)


async def test_embedded_spec_and_fields_merge_and_bad_fields_are_invalid_request(home):
    async with AsyncOrchard() as orch:
        sandbox = await orch.create(SandboxSpec(env={"A": "1"}), workdir="/workspace/deep")
        assert (await sandbox.exec("echo $A; pwd")).stdout == "1\n/workspace/deep\n"
        with pytest.raises(InvalidRequest, match="cpu"):
            await orch.create(cpu=-1)
        with pytest.raises(InvalidRequest, match="no_such_field"):
            await orch.create(no_such_field=1)
        with pytest.raises(InvalidRequest, match="server"):
            await orch.create(detach=True)


async def test_upload_directory_into_a_workdir_under_a_read_only_root(home, tmp_path):
    """The workdir is mounted under the host's read-only root: uploading a tree into it must stage the
    extraction inside the workdir itself, and merge with what is already there."""
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text("X = 1\n")
    async with AsyncOrchard() as orch:
        sandbox = await orch.create(image="host", workdir="/testbed")
        await sandbox.write_file("keep.txt", b"kept")
        await sandbox.upload(tmp_path / "src", "/testbed")
        listing = await sandbox.exec("ls -A /testbed; cat pkg/mod.py keep.txt")
        assert listing.stdout == "keep.txt\npkg\nX = 1\nkept", listing


async def test_sandbox_close_deletes_it_and_connect_only_attaches(home):
    async with AsyncOrchard() as orch:
        owned = await orch.create()
        attached = await orch.connect(owned.id)
        assert (await attached.exec("echo attached")).stdout == "attached\n"
        await attached.close()
        assert (await orch.get(owned.id)).state == "ready"
        await owned.close()
        assert (await orch.get(owned.id)).state == "deleted"
        with pytest.raises(NotFound):
            await orch.get("no-such-sandbox")
        with pytest.raises(NotFound):
            await orch.connect("no-such-sandbox")


async def test_async_context_manager_deletes_sandboxes_when_the_body_raises(home):
    ids = []
    with pytest.raises(RuntimeError, match="boom"):
        async with AsyncOrchard() as orch:
            ids += [(await orch.create()).id, (await orch.create()).id]
            raise RuntimeError("boom")
    for sandbox_id in ids:
        await assert_gone(home, sandbox_id)


async def test_closed_client_refuses_new_work(home):
    orch = AsyncOrchard()
    await orch.close()
    with pytest.raises(InvalidRequest, match="closed"):
        await orch.create()


def test_embedded_sync_end_to_end_and_exception_cleanup(home):
    with Orchard() as orch:
        with orch.create(image="host") as sandbox:
            assert sandbox.exec("echo hi").stdout == "hi\n"
            sandbox.write_file("f.txt", "text")
            assert sandbox.read_file("f.txt") == b"text"
        assert orch.get(sandbox.id).state == "deleted"
        kept = orch.create()
        assert orch.get(kept.id).state == "ready"

    with pytest.raises(ValueError):
        with Orchard() as orch:
            failing = orch.create()
            raise ValueError("body failed")
    with Orchard() as orch:
        assert orch.get(kept.id).state == "deleted"
        assert orch.get(failing.id).state == "deleted"


SYNC_WAITING = """
    import time
    from orchard import Orchard
    with Orchard() as orch:
        sb = orch.create()
        print(sb.id, flush=True)
        time.sleep(60)
"""
EXIT_SCRIPTS = {
    # SIGTERM while the sync client waits on the main thread.
    "sync_sigterm": SYNC_WAITING,
    # SIGTERM while asyncio.run is in the middle of an await.
    "async_sigterm": """
        import asyncio
        from orchard import AsyncOrchard
        async def main():
            async with AsyncOrchard() as orch:
                sb = await orch.create()
                print(sb.id, flush=True)
                await asyncio.sleep(60)
        asyncio.run(main())
    """,
    # Ctrl-C while the sync client waits on the main thread.
    "sync_sigint": SYNC_WAITING,
    # Never closed, sync: the hook at interpreter exit deletes it.
    "sync_unclosed": """
        from orchard import Orchard
        orch = Orchard()
        print(orch.create().id, flush=True)
    """,
    # Never closed, async: deleted when asyncio.run shuts its loop down.
    "async_unclosed": """
        import asyncio
        from orchard import AsyncOrchard
        orch = AsyncOrchard()
        async def main():
            print((await orch.create()).id, flush=True)
        asyncio.run(main())
    """,
}


@pytest.mark.parametrize("case", sorted(EXIT_SCRIPTS))
async def test_embedded_sandboxes_are_deleted_when_the_process_ends(home, case):
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(EXIT_SCRIPTS[case])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        sandbox_id = child.stdout.readline().strip()
        assert sandbox_id, child.stderr.read()
        sent = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT}.get(case.split("_")[1])
        if sent is not None:
            time.sleep(0.2)
            child.send_signal(sent)
        # An uncaught KeyboardInterrupt ends Python by SIGINT itself (returncode -2).
        expected_exit = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: -signal.SIGINT, None: 0}[sent]
        assert child.wait(timeout=60) == expected_exit, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    await assert_gone(home, sandbox_id)


# --- remote --------------------------------------------------------------------------------------------


async def test_remote_async_end_to_end(server, home):
    async with AsyncOrchard(server.url, API_KEY) as orch:
        assert not orch.embedded
        sandbox = await orch.create(image="host", labels={"t": "remote"})
        assert (await sandbox.exec(["echo", "remote"])).stdout == "remote\n"
        info = await orch.get(sandbox.id)
        assert info.state == "ready" and info.owner
        assert [s.id for s in await orch.list(labels={"t": "remote"})] == [sandbox.id]
        assert (await orch.wait_ready(sandbox.id)).state == "ready"
        await orch.heartbeat(sandbox.id)
        other = await orch.create()
        await orch.delete(other.id)
        assert (await orch.get(other.id)).state == "deleted"
    async with AsyncOrchard(server.url, API_KEY) as orch:
        assert (await orch.get(sandbox.id)).state == "deleted"


async def test_remote_reads_url_and_key_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("ORCHARD_URL", server.url)
    monkeypatch.setenv("ORCHARD_API_KEY", API_KEY)
    async with AsyncOrchard() as orch:
        assert orch.url == server.url
        assert isinstance(await orch.list(), list)


async def test_remote_typed_errors(server, home):
    async with AsyncOrchard(server.url, API_KEY) as orch:
        with pytest.raises(NotFound):
            await orch.get("sb-does-not-exist")
        with pytest.raises(NotFound):
            await orch.delete("sb-does-not-exist")
        with pytest.raises(InvalidRequest, match="(?i)rootfs|image"):
            await orch.create(image=str(home / "no-such-rootfs"))
    async with AsyncOrchard(server.url, "wrong-key") as orch:
        with pytest.raises(AuthError):
            await orch.list()
    async with AsyncOrchard(server.url) as orch:
        with pytest.raises(AuthError, match="ORCHARD_API_KEY"):
            await orch.list()


async def test_remote_unreachable_server_is_a_clear_backend_error(home):
    url = f"http://127.0.0.1:{free_port()}"
    async with AsyncOrchard(url, API_KEY) as orch:
        with pytest.raises(BackendError, match="cannot reach the Orchard server") as caught:
            await returns(orch.list(), "a call to a server that is not there")  # a few connect retries
    assert url in str(caught.value)
    with pytest.raises(InvalidRequest, match="http"):
        AsyncOrchard("ftp://example.org", API_KEY)


def test_remote_sync_deletes_sandboxes_when_the_body_raises(server):
    with pytest.raises(OrchardError, match="inner"):
        with Orchard(server.url, API_KEY) as orch:
            sandbox = orch.create()
            assert sandbox.exec("echo sync-remote").stdout == "sync-remote\n"
            raise OrchardError("inner")
    with Orchard(server.url, API_KEY) as orch:
        assert orch.get(sandbox.id).state == "deleted"


def test_remote_detached_sandbox_outlives_its_client(server):
    with Orchard(server.url, API_KEY) as orch:
        detached = orch.create(detach=True)
        detached.close()
    with Orchard(server.url, API_KEY) as orch:
        assert orch.get(detached.id).state == "ready"
        with orch.connect(detached.id) as attached:
            assert attached.exec("echo still here").stdout == "still here\n"
        orch.delete(detached.id)
        assert orch.get(detached.id).state == "deleted"


async def test_remote_error_without_an_orchard_body_is_typed_by_status(tmp_path):
    """A server that is not Orchard (here Python's own http.server, as a stand-in for a proxy) answers
    404 in HTML: still a NotFound, naming what answered."""
    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                              "--directory", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with AsyncOrchard(f"http://127.0.0.1:{port}", API_KEY) as orch:
            with pytest.raises(NotFound, match="answered 404"):
                await orch.get("sb-anything")
    finally:
        other.terminate()
        other.wait()


def test_remote_sync_forward_port_serves_http_and_closes_with_the_sandbox(server, tmp_path):
    """Through `orchard serve` the client still reaches the sandbox's agent itself for its ports."""
    import httpx

    from orchard.testing.conformance._rig import wait_until

    (tmp_path / "index.html").write_text("served from inside")
    with Orchard(server.url, API_KEY) as orch:
        sandbox = orch.create(image="host")
        sandbox.upload(tmp_path / "index.html", "site/index.html")
        sandbox.exec("cd site && python3 -m http.server 8080 --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &")
        forward = sandbox.forward_port(8080)

        def served() -> str | None:
            try:
                return httpx.get(forward.url("http", "/index.html"), timeout=10).text
            except httpx.HTTPError:
                return None

        assert wait_until(served, "the server inside") == "served from inside"
        sandbox.close()
        with pytest.raises(httpx.ConnectError):
            httpx.get(forward.url(), timeout=10)
