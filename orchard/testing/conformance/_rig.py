"""The suite's rig: an orchestrator on the backend under test run on the suite's own event loop, the
fixtures every check shares (one shared sandbox, fresh orchestrators), and small probes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, ClassVar, Iterator, TypeVar

import pytest

from orchard.core.backend import Backend, BackendConfig
from orchard.core.sandbox import SandboxInfo, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.registry import create_backend
from orchard.sandbox.server.models import ReconcileReport
from orchard.sandbox.server.service import SandboxService
from orchard.sandbox.server.store import SandboxStore
from orchard.sandbox.sync import LoopThread, SyncSandbox

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

class ConformanceRig:
    """The fixtures and spec helpers of every check; `BackendConformance` is what a backend subclasses."""

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


def host_address_for_mode(orchestrator, mode: str) -> str:
    """This machine's address for a sandbox with network `mode` to reach; skips when the backend does not
    declare the mode, or the machine has no non-loopback IPv4 address."""
    if mode not in orchestrator.backend.capabilities.network_modes:
        pytest.skip(f"the {orchestrator.backend.name} backend does not declare network mode {mode!r}")
    address = host_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address for the sandbox to reach")
    return address

