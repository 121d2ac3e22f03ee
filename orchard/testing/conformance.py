"""The backend conformance suite: what every Orchard backend must do, checked on real sandboxes through the
real orchestrator (`SandboxService` on a `SandboxStore`) and the real agent client.

A backend runs it by subclassing `BackendConformance` in a test module and giving it one fixture,
`make_backend_config`: a function from a fresh state directory to a config of the backend under test. Each
call must give a config whose sandboxes no other call's backend sees (`list_live`), because each call
starts an orchestrator of its own, and an orchestrator deletes what its backend runs and its store does not
know. The local backend's (tests/conformance/test_local.py) is the whole of it:

    class TestLocalBackend(BackendConformance):
        @pytest.fixture(scope="class")
        def make_backend_config(self):
            return lambda home: backend_config("local", home)

Class attributes say what the sandboxes run on: `image` (default "host"; an OCI backend names an image with
a POSIX shell, busybox or coreutils, and python3, nc or bash for the network tests), `max_processes` and
`memory_mb` (what the limit tests ask for). Adding the Docker backend is as many lines, in
`tests/conformance/test_docker.py` (`require_docker` standing for however its other tests skip without a
daemon, or fail with ORCHARD_DOCKER=1):

    pytestmark = pytest.mark.docker

    class TestDockerBackend(BackendConformance):
        image = SOME_IMAGE_WITH_A_SHELL

        @pytest.fixture(scope="class")
        def make_backend_config(self):
            require_docker()
            return lambda home: backend_config("docker", home, instance=f"c{secrets.token_hex(4)}")

See docs/conformance.md.

A test is skipped only where the backend's `capabilities` say it lacks the thing tested (a network mode,
a limit); asking for what it lacks must then be refused with InvalidRequest naming the backend, which is
tested too. The tests are synchronous: the orchestrator and the sandboxes' clients run on an event loop
of the suite's own, so the suite needs no pytest-asyncio configuration."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Awaitable, Callable, ClassVar, Iterator, TypeVar

import pytest

from orchard.core.backend import LIMIT_NAMES, Backend, BackendConfig
from orchard.core.errors import AuthError, InvalidRequest, NotFound, SandboxLost
from orchard.core.sandbox import NetworkPolicy, SandboxInfo, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.registry import create_backend
from orchard.sandbox.server.models import ReconcileReport
from orchard.sandbox.server.service import SandboxService, new_sandbox_id
from orchard.sandbox.server.store import SandboxStore
from orchard.sandbox.sync import LoopThread, SyncSandbox, SyncShellSession

T = TypeVar("T")

CALL_TIMEOUT_S = 300.0  # one orchestrator or agent call; a backend that hangs fails instead of stalling
SETTLE_TIMEOUT_S = 60.0  # waiting for something that happens in the background (the reaper, a kill)
REAP_INTERVAL_S = 0.2
SPEC_ENV = {"ORCHARD_CONFORMANCE": "spec-env"}

# Connects to HOST PORT from inside a sandbox with whatever the image has; prints CONNECTED on success.
TCP_PROBE = """
if command -v python3 >/dev/null 2>&1; then
  connect='import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)'
  python3 -c "$connect" "$1" "$2" && echo CONNECTED
elif command -v nc >/dev/null 2>&1; then
  nc -w 5 "$1" "$2" </dev/null && echo CONNECTED
elif command -v bash >/dev/null 2>&1; then
  bash -c 'exec 3<>"/dev/tcp/$1/$2"' probe "$1" "$2" && echo CONNECTED
else
  echo "NO-PROBE: the image has none of python3, nc or bash to open a TCP connection"; exit 99
fi
"""
PUBLIC_ADDRESS = ("1.1.1.1", 80)


class Orchestrator:
    """A `SandboxService` on the backend under test with its store under `home`, on `loop`. Sync methods;
    `run` runs any coroutine on the loop."""

    def __init__(self, config: BackendConfig, home: Path, loop: LoopThread) -> None:
        self.config, self.home, self.loop = config, home, loop
        self.service = SandboxService(create_backend(config), SandboxStore(home / "state.db"),
                                      reap_interval_s=REAP_INTERVAL_S)
        self.report: ReconcileReport = self.run(self.service.start())

    @property
    def backend(self) -> Backend:
        return self.service.backend

    def run(self, coro: Awaitable[T], timeout: float = CALL_TIMEOUT_S) -> T:
        return self.loop.run(coro, timeout)

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        return self.run(self.service.create(spec, owner="conformance"))

    def attach(self, info: SandboxInfo) -> SyncSandbox:
        """A client of the sandbox's agent (closing it closes only the connection)."""
        assert info.agent_url and info.token, info
        return SyncSandbox(AgentSandbox(info.id, info.agent_url, info.token, workdir=info.spec.workdir),
                           self.loop)

    @contextlib.contextmanager
    def sandbox(self, spec: SandboxSpec) -> Iterator[tuple[SandboxInfo, SyncSandbox]]:
        """A sandbox for one test, deleted afterwards."""
        info = self.create(spec)
        client = self.attach(info)
        try:
            yield info, client
        finally:
            client.close()
            self.run(self.service.delete(info.id))

    def live_ids(self) -> set[str]:
        return {found.id for found in self.run(self.backend.list_live())}

    def stop(self, *, delete_all: bool) -> None:
        self.run(self.service.stop(delete_all=delete_all))


async def live_ids_of(config: BackendConfig) -> set[str]:
    """What a fresh backend on `config` finds running."""
    backend = create_backend(config)
    try:
        return {found.id for found in await backend.list_live()}
    finally:
        await backend.close()


async def sweep(config: BackendConfig) -> None:
    """Delete whatever a fresh backend on `config` finds running (teardown, after a failed test too)."""
    backend = create_backend(config)
    try:
        for found in await backend.list_live():
            await backend.delete(found)
    finally:
        await backend.close()


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = SETTLE_TIMEOUT_S) -> Any:
    """Poll `predicate` until it is truthy; fail naming `what` after `timeout` (a bound, not a measure)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def process_state(sandbox: SyncSandbox, pid: str) -> str:
    """The state letter of process `pid` in the sandbox (R, S, Z for a zombie...), "" when there is none."""
    r = sandbox.exec(f"sed -n 's/.*) \\([A-Za-z]\\) .*/\\1/p' /proc/{pid}/stat 2>/dev/null; true")
    return r.stdout.strip()


def host_address() -> str | None:
    """This machine's address on the interface of its default route (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


@contextlib.contextmanager
def tcp_server() -> Iterator[int]:
    """A TCP server on every host address that accepts connections and closes them; yields its port."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            connection.close()

    thread = threading.Thread(target=serve, name="conformance-tcp", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def probe_tcp(sandbox: SyncSandbox, host: str, port: int) -> tuple[bool, str]:
    r = sandbox.exec(["sh", "-c", TCP_PROBE, "probe", host, str(port)], timeout=60)
    assert r.exit_code != 99, r.stdout  # no tool to probe with: the test cannot tell anything
    return "CONNECTED" in r.stdout, r.stdout + r.stderr


class BackendConformance:
    """Subclass in a test module (named Test...) and provide the `make_backend_config` fixture."""

    image: ClassVar[str] = "host"
    max_processes: ClassVar[int] = 64
    memory_mb: ClassVar[int] = 128

    # --- what a backend provides -----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    def make_backend_config(self) -> Callable[[Path], BackendConfig]:
        pytest.fail("a BackendConformance subclass must define the class-scoped fixture make_backend_config, "
                    "returning a function from a state directory to a config of the backend under test",
                    pytrace=False)

    # --- the suite's own fixtures ----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    def loop(self) -> Iterator[LoopThread]:
        thread = LoopThread("orchard-conformance")
        yield thread
        thread.close()

    @pytest.fixture(scope="class")
    def new_orchestrator(self, make_backend_config, loop, tmp_path_factory) -> Iterator[Callable[[], Orchestrator]]:
        """Starts orchestrators, each on a config of its own; whatever they run is deleted at the end."""
        started: list[Orchestrator] = []

        def start() -> Orchestrator:
            home = tmp_path_factory.mktemp("orchard-home")
            orchestrator = Orchestrator(make_backend_config(home), home, loop)
            started.append(orchestrator)
            return orchestrator

        yield start
        for orchestrator in started:
            with contextlib.suppress(Exception):
                orchestrator.stop(delete_all=True)

            loop.run(sweep(orchestrator.config), CALL_TIMEOUT_S)

    @pytest.fixture(scope="class")
    def orchestrator(self, new_orchestrator) -> Orchestrator:
        """The orchestrator most tests share."""
        return new_orchestrator()

    @pytest.fixture(scope="class")
    def shared(self, orchestrator) -> Iterator[tuple[SandboxInfo, SyncSandbox]]:
        """One sandbox for the tests that leave it as they found it."""
        info = orchestrator.create(self._spec_for(orchestrator, env=SPEC_ENV, labels={"conformance": "shared"}))
        client = orchestrator.attach(info)
        yield info, client
        client.close()

    @pytest.fixture
    def sandbox(self, shared) -> SyncSandbox:
        return shared[1]

    def spec(self, **fields: Any) -> SandboxSpec:
        """A spec on this suite's image; without `max_processes` when the backend cannot enforce it (the
        spec's default asks for 512)."""
        return SandboxSpec(**{"image": self.image, **fields})

    def _spec_for(self, orchestrator: Orchestrator, **fields: Any) -> SandboxSpec:
        if "max_processes" not in orchestrator.backend.capabilities.limits:
            fields.setdefault("max_processes", None)
        return self.spec(**fields)

    # --- lifecycle -------------------------------------------------------------------------------------

    def test_create_returns_a_ready_sandbox_found_by_label_and_by_the_backend(self, orchestrator, shared):
        info, sandbox = shared
        backend = orchestrator.backend
        assert info.state == "ready" and info.backend == backend.name
        assert info.agent_url and info.token
        assert orchestrator.run(orchestrator.service.get(info.id)).state == "ready"
        listed = orchestrator.run(orchestrator.service.list(labels={"conformance": "shared"}))
        assert [i.id for i in listed] == [info.id]
        assert orchestrator.run(orchestrator.service.list(labels={"conformance": "no-such-label"})) == []
        live = {found.id: found for found in orchestrator.run(backend.list_live())}
        assert info.id in live and live[info.id].agent_url == info.agent_url
        assert orchestrator.run(backend.is_alive(live[info.id]))
        assert sandbox.exec("echo ready").stdout == "ready\n"

    def test_delete_removes_everything_and_is_idempotent(self, orchestrator):
        info = orchestrator.create(self._spec_for(orchestrator))
        made = orchestrator.service.store.get(info.id).backend
        client = orchestrator.attach(info)
        assert client.exec("sleep 300 >/dev/null 2>&1 & echo started").stdout == "started\n"
        orchestrator.run(orchestrator.service.delete(info.id))
        assert orchestrator.run(orchestrator.service.get(info.id)).state == "deleted"
        assert info.id not in orchestrator.live_ids()
        assert not orchestrator.run(orchestrator.backend.is_alive(made))
        with pytest.raises(SandboxLost):
            client.exec("true")
        client.close()
        orchestrator.run(orchestrator.service.delete(info.id))  # deleting again does nothing
        orchestrator.run(orchestrator.backend.delete(made))  # nor does the backend's own delete, again
        assert info.id not in orchestrator.live_ids()

    def test_a_bad_spec_is_invalid_and_leaves_nothing(self, orchestrator):
        before = {i.id for i in orchestrator.run(orchestrator.service.list())}
        live_before = orchestrator.live_ids()
        with pytest.raises(InvalidRequest, match="workdir"):
            orchestrator.create({"image": self.image, "workdir": "relative/path"})
        kinds = orchestrator.backend.capabilities.image_kinds
        missing = ("localhost/orchard-conformance-no-such-image:nope" if "oci" in kinds
                   else "/nonexistent/orchard-conformance-rootfs" if "rootfs" in kinds else None)
        if missing is not None:
            with pytest.raises(InvalidRequest):
                orchestrator.create(self._spec_for(orchestrator, image=missing))
        assert {i.id for i in orchestrator.run(orchestrator.service.list())} == before
        assert orchestrator.live_ids() == live_before

    def test_what_the_backend_lacks_is_refused_naming_it(self, orchestrator):
        capabilities, name = orchestrator.backend.capabilities, orchestrator.backend.name
        lacking: dict[str, SandboxSpec] = {}
        for mode in ("none", "allowlist", "open"):
            if mode not in capabilities.network_modes:
                allow = ["192.0.2.1"] if mode == "allowlist" else []
                lacking[mode] = self._spec_for(orchestrator, network=NetworkPolicy(mode=mode, allow=allow))
        values = {"cpu": 1.0, "memory_mb": 256, "disk_mb": 256, "max_processes": 256}
        for limit in LIMIT_NAMES:
            if limit not in capabilities.limits:
                lacking[limit] = self._spec_for(orchestrator, **{limit: values[limit]})
        examples = {"host": "host", "rootfs": "/nonexistent/orchard-conformance-rootfs",
                    "oci": "localhost/orchard-conformance:none"}
        for kind, image in examples.items():
            if kind not in capabilities.image_kinds:
                lacking[f"images of kind {kind!r}"] = self._spec_for(orchestrator, image=image)
        if not lacking:
            pytest.skip(f"the {name} backend declares every network mode, limit and image kind")
        live_before = orchestrator.live_ids()
        for what, spec in lacking.items():
            with pytest.raises(InvalidRequest, match=f"the {name} backend") as refused:
                orchestrator.create(spec)
            assert what in str(refused.value), (what, str(refused.value))
        assert orchestrator.live_ids() == live_before

    def test_a_sandbox_past_its_ttl_is_deleted_by_the_reaper(self, orchestrator):
        info = orchestrator.create(self._spec_for(orchestrator, timeout_s=2))

        def gone() -> SandboxInfo | None:
            now = orchestrator.run(orchestrator.service.get(info.id))
            return now if now.state == "deleted" else None

        deleted = wait_until(gone, "the reaper to delete a sandbox past its TTL")
        assert "TTL" in (deleted.error or "")
        assert info.id not in orchestrator.live_ids()

    # --- exec ------------------------------------------------------------------------------------------

    def test_exec_reports_stdout_stderr_and_the_exit_code(self, sandbox):
        r = sandbox.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
        assert not r.stdout_truncated and not r.stderr_truncated
        argv = sandbox.exec(["echo", "argv", "$NOT_EXPANDED"])
        assert argv.ok and argv.stdout == "argv $NOT_EXPANDED\n"
        assert sandbox.exec(["definitely-not-a-program-orchard"]).exit_code == 127

    def test_exec_env_cwd_and_stdin(self, shared):
        info, sandbox = shared
        assert sandbox.exec("pwd").stdout == info.spec.workdir + "\n"
        assert sandbox.exec("pwd", cwd="/").stdout == "/\n"
        r = sandbox.exec("echo $ORCHARD_CONFORMANCE $EXTRA", env={"EXTRA": "per-command"})
        assert r.stdout == "spec-env per-command\n"
        data = "line\n" * 20000  # more than a pipe buffer
        assert sandbox.exec("cat", stdin=data).stdout == data

    def test_exec_timeout_kills_the_command_and_its_children(self, sandbox):
        r = sandbox.exec("sleep 300 & echo $!; sleep 300", timeout=1)
        assert r.timed_out and r.exit_code is None
        child = r.stdout.split()[0]
        wait_until(lambda: process_state(sandbox, child) in ("", "Z"),
                   f"the timed-out command's child {child} to be killed")

    def test_processes_left_behind_are_reaped_when_they_end(self, sandbox):
        """A command's background process outlives it, ends, and must not stay a zombie: zombies fill the
        process table (and count against max_processes) until the sandbox can start nothing."""
        r = sandbox.exec("sleep 0.2 >/dev/null 2>&1 & echo $!")
        orphan = r.stdout.split()[0]
        wait_until(lambda: process_state(sandbox, orphan) == "",
                   f"process {orphan}, which ended after its parent, to be reaped (it stays a zombie when "
                   "the sandbox's init process does not reap orphans)", timeout=10)

    def test_exec_output_over_the_cap_is_truncated_and_reported(self, sandbox):
        r = sandbox.exec("head -c 100000 /dev/zero | tr '\\0' a; echo e >&2", max_output_bytes=1000)
        assert r.exit_code == 0 and r.stdout == "a" * 1000 and r.stdout_truncated
        assert r.stderr == "e\n" and not r.stderr_truncated

    def test_exec_stream_yields_output_in_order_then_the_result(self, sandbox):
        events = list(sandbox.exec_stream("echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three"))
        assert [(e.kind, e.data) for e in events[:-1]] == [("stdout", "one\n"), ("stderr", "two\n"),
                                                           ("stdout", "three\n")]
        assert events[-1].kind == "exit" and events[-1].result.exit_code == 0
        timed = list(sandbox.exec_stream("echo started; sleep 300", timeout=1))
        assert timed[0].data == "started\n" and timed[-1].result.timed_out

    @pytest.fixture
    def session(self, sandbox) -> Iterator[SyncShellSession]:
        session = sandbox.shell(f"conformance-{secrets.token_hex(3)}")
        assert session.run("cd / && export KEPT=42").exit_code == 0
        yield session
        session.close()

    def test_a_shell_session_keeps_its_directory_and_exports(self, session):
        r = session.run("pwd; echo $KEPT; false")
        assert r.output == "/\n42\n" and r.exit_code == 1
        assert session.run("echo $KEPT; pwd").output == "42\n/\n"

    def test_a_session_command_past_its_timeout_is_stopped_and_the_session_kept(self, session):
        timed = session.run("sleep 300; echo not-reached", timeout=1)
        assert timed.timed_out and timed.exit_code is None
        assert "not-reached" not in timed.output, f"the rest of the command line ran after the timeout: {timed}"
        assert session.run("echo $KEPT; pwd").output == "42\n/\n"

    def test_an_interrupted_session_command_is_stopped_and_the_session_kept(self, sandbox, session):
        marker = f"/tmp/conformance-interrupt-{secrets.token_hex(3)}"
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(session.run, f"touch {marker}; sleep 300; echo not-reached")
            wait_until(lambda: sandbox.exec(f"test -e {marker}").ok, "the session's command to start")
            session.interrupt()
            interrupted = pending.result(timeout=CALL_TIMEOUT_S)
        assert not interrupted.timed_out
        assert "not-reached" not in interrupted.output, f"the rest of the command line ran after the interrupt: " \
                                                          f"{interrupted}"
        assert interrupted.exit_code == 130, interrupted  # like Ctrl-C (docs/agent-protocol.md)
        assert session.run("echo $KEPT; pwd").output == "42\n/\n"

    # --- files -----------------------------------------------------------------------------------------

    def test_files_write_read_stat_and_list(self, shared):
        info, sandbox = shared
        folder = f"files-{secrets.token_hex(3)}"
        sandbox.write_file(f"{folder}/sub/a.txt", "text\n")
        sandbox.write_file(f"{folder}/run.sh", b"#!/bin/sh\necho ran\n", mode=0o750)
        assert sandbox.read_file(f"{info.spec.workdir}/{folder}/sub/a.txt") == b"text\n"
        assert sandbox.exec(f"cat {folder}/sub/a.txt && ./{folder}/run.sh").stdout == "text\nran\n"
        stat = sandbox.stat(f"{folder}/run.sh")
        assert not stat.is_dir and stat.size == len(b"#!/bin/sh\necho ran\n") and stat.mode & 0o777 == 0o750
        assert sandbox.stat(f"{folder}/sub").is_dir
        assert [(f.name, f.is_dir) for f in sandbox.list_dir(folder)] == [("run.sh", False), ("sub", True)]

    def test_files_are_binary_safe(self, sandbox):
        data = bytes(range(256)) * 257
        sandbox.write_file("binary.bin", data)
        assert sandbox.read_file("binary.bin") == data
        assert sandbox.exec("wc -c < binary.bin").stdout.strip() == str(len(data))

    def test_a_missing_file_is_not_found(self, sandbox):
        for call in (lambda: sandbox.read_file("no/such/file"), lambda: sandbox.stat("no/such/file"),
                     lambda: sandbox.list_dir("no/such/dir")):
            with pytest.raises(NotFound):
                call()

    def test_a_directory_tree_uploads_and_downloads_intact(self, sandbox, tmp_path):
        tree = {"top.txt": b"top\n", "empty": b"", "a/b/c.bin": bytes(range(256)) * 40, "a/d.txt": b"d\n"}
        source = tmp_path / "source"
        for name, data in tree.items():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes(data)
        remote = f"tree-{secrets.token_hex(3)}"
        sandbox.upload(source, remote)
        assert sandbox.read_file(f"{remote}/a/b/c.bin") == tree["a/b/c.bin"]
        listing = sandbox.exec(f"cd {remote} && find . -type f | sort").stdout.split()
        assert listing == sorted(f"./{name}" for name in tree)
        sandbox.download(remote, tmp_path / "back")
        back = {str(p.relative_to(tmp_path / "back")): p.read_bytes()
                for p in (tmp_path / "back").rglob("*") if p.is_file()}
        assert back == tree

    # --- isolation -------------------------------------------------------------------------------------

    def test_host_files_outside_the_sandbox_are_invisible(self, orchestrator, sandbox, tmp_path):
        """A file in the test's own temporary directory (pytest's, private to this user), and the
        orchestrator's store."""
        secret = f"host-secret-{secrets.token_hex(8)}"
        (tmp_path / "secret.txt").write_text(secret)
        state = orchestrator.home / "state.db"  # the orchestrator's store: it holds every sandbox's token
        for path in (tmp_path / "secret.txt", state):
            r = sandbox.exec(f"cat {path}")
            assert r.exit_code != 0 and secret not in r.stdout and r.stdout == "", (path, r)
        r = sandbox.exec(f"ls {tmp_path}")
        assert r.exit_code != 0 and "secret.txt" not in r.stdout

    def test_another_sandboxs_token_is_refused(self, orchestrator, shared):
        info, _ = shared
        with orchestrator.sandbox(self._spec_for(orchestrator)) as (other, _):
            assert other.token != info.token
            crossed = orchestrator.attach(info.model_copy(update={"token": other.token}))
            try:
                with pytest.raises(AuthError):
                    crossed.exec("echo should-not-run")
            finally:
                crossed.close()

    def test_network_none_reaches_nothing_outside(self, orchestrator, sandbox, shared):
        info, _ = shared
        assert info.spec.network.mode == "none"
        address = host_address()
        with tcp_server() as port:
            targets = [(address, port)] if address else []
            for host, target_port in [*targets, PUBLIC_ADDRESS]:
                connected, output = probe_tcp(sandbox, host, target_port)
                assert not connected, f"network 'none' reached {host}:{target_port}: {output}"

    def test_network_open_reaches_a_server_on_the_host(self, orchestrator):
        address = _host_address_for_mode(orchestrator, "open")
        with tcp_server() as port, orchestrator.sandbox(
                self._spec_for(orchestrator, network=NetworkPolicy(mode="open"))) as (_, sandbox):
            connected, output = probe_tcp(sandbox, address, port)
            assert connected, f"network 'open' did not reach {address}:{port} on the host: {output}"

    def test_network_allowlist_reaches_only_what_it_allows(self, orchestrator):
        address = _host_address_for_mode(orchestrator, "allowlist")
        with tcp_server() as allowed, tcp_server() as other:
            spec = self._spec_for(orchestrator, network=NetworkPolicy(mode="allowlist",
                                                                      allow=[f"{address}:{allowed}"]))
            with orchestrator.sandbox(spec) as (_, sandbox):
                connected, output = probe_tcp(sandbox, address, allowed)
                assert connected, f"network 'allowlist' did not reach the allowed {address}:{allowed}: {output}"
                connected, output = probe_tcp(sandbox, address, other)
                assert not connected, f"network 'allowlist' reached {address}:{other}, not allowed: {output}"

    # --- limits ----------------------------------------------------------------------------------------

    def test_max_processes_caps_a_fork_loop(self, orchestrator):
        if "max_processes" not in orchestrator.backend.capabilities.limits:
            pytest.skip(f"the {orchestrator.backend.name} backend does not declare the max_processes limit")
        limit = self.max_processes
        # Each started process lives 5 s; the shell stops (or the timeout kills it) when a fork fails.
        loop = (f"n=0; while [ $n -lt {2 * limit} ]; do sleep 5 & n=$((n+1)); echo $n; done; "
                "echo all-started")
        with orchestrator.sandbox(self._spec_for(orchestrator, max_processes=limit)) as (_, sandbox):
            r = sandbox.exec(loop, timeout=60)
            assert "all-started" not in r.stdout, f"{2 * limit} processes started under max_processes={limit}"
            started = int(r.stdout.split()[-1]) if r.stdout.split() else 0
            assert started < limit

            def usable() -> bool:
                with contextlib.suppress(Exception):
                    return sandbox.exec("echo usable").stdout == "usable\n"
                return False

            wait_until(usable, "the sandbox to run commands again once the processes ended")

    def test_memory_limit_stops_a_hog_and_the_sandbox_survives(self, orchestrator):
        if "memory_mb" not in orchestrator.backend.capabilities.limits:
            pytest.skip(f"the {orchestrator.backend.name} backend does not declare the memory_mb limit")
        limit = self.memory_mb
        with orchestrator.sandbox(self._spec_for(orchestrator, memory_mb=limit)) as (_, sandbox):
            small = sandbox.exec("dd if=/dev/zero of=/dev/null bs=16M count=1 && echo fits", timeout=120)
            assert "fits" in small.stdout, small
            hog = sandbox.exec(f"dd if=/dev/zero of=/dev/null bs={4 * limit}M count=1 && echo survived",
                               timeout=120)
            assert hog.exit_code != 0 and "survived" not in hog.stdout, hog
            assert sandbox.exec("echo alive").stdout == "alive\n"

    # --- restart ---------------------------------------------------------------------------------------

    def test_a_restarted_orchestrator_readopts_its_sandboxes_and_removes_orphans(self, new_orchestrator):
        first = new_orchestrator()
        kept = first.create(self._spec_for(first, labels={"conformance": "kept"}))
        first.stop(delete_all=False)  # the orchestrator goes; its sandboxes stay
        orphan_id = new_sandbox_id()

        async def make_orphan() -> None:  # a sandbox its backend runs but no store knows
            backend = create_backend(first.config)
            try:
                await backend.create(orphan_id, self._spec_for(first), secrets.token_urlsafe(16))
            finally:
                await backend.close()

        first.run(make_orphan())
        second = Orchestrator(first.config, first.home, first.loop)  # a new backend on the same config
        try:
            assert second.report.adopted == [kept.id]
            assert second.report.orphans_removed == [orphan_id]
            assert second.live_ids() == {kept.id}
            info = second.run(second.service.get(kept.id))
            assert info.state == "ready" and info.token == kept.token and info.agent_url == kept.agent_url
            client = second.attach(info)
            try:
                assert client.exec("echo still here").stdout == "still here\n"
            finally:
                client.close()
        finally:
            second.stop(delete_all=True)
        assert first.run(live_ids_of(first.config)) == set()


def _host_address_for_mode(orchestrator, mode: str) -> str:
    """This machine's address for a sandbox with network `mode` to reach; skips when the backend does not
    declare the mode, or the machine has no non-loopback IPv4 address."""
    if mode not in orchestrator.backend.capabilities.network_modes:
        pytest.skip(f"the {orchestrator.backend.name} backend does not declare network mode {mode!r}")
    address = host_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the sandbox to reach")
    return address
