"""Test helpers for the security tests, on real parts: `orchard serve` as a subprocess (the key passed the
way an operator must: in the environment), that can be stopped, SIGKILLed and restarted on one home, and
what a home still holds afterwards (sandbox and run directories, cgroups, processes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

import httpx
import pytest

from orchard.sandbox.backends.local import cgroups
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.registry import backend_config
from orchard.sandbox.server.home import state_db_path
from tests.running_server import environments, free_port, stop_process, wait_for  # noqa: F401  (for the tests)

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "security-test-key"
MARK = "ORCHARD_TEST_MARK"


class Serve:
    """`orchard serve` on `home`. `wrapper`: argv put in front (e.g. `unshare ...`); `env`: extra variables."""

    def __init__(self, home: Path, *, wrapper: Sequence[str] = (), env: dict[str, str] | None = None,
                 args: Sequence[str] = ()) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / f"serve-{uuid.uuid4().hex[:6]}.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
        environment.update({"ORCHARD_HOME": str(home), "ORCHARD_API_KEY": API_KEY, **(env or {})})
        command = [*wrapper, sys.executable, "-m", "orchard.cli.main", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port), *args]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stdout=log,
                                            stderr=subprocess.STDOUT)

    def wait_up(self) -> "Serve":
        def up() -> bool:
            assert self.process.poll() is None, f"orchard serve exited:\n{self.log.read_text()}"
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(up, 60, "orchard serve to answer /healthz")
        except BaseException:
            self.kill()
            raise
        return self

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)

    def stop(self) -> None:
        """SIGTERM: the service stops, its sandboxes keep running for the next server."""
        stop_process(self.process)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing of the shutdown runs."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def serving(home: Path, **options: Any) -> Iterator[Serve]:
    """`orchard serve` on `home` (`options`: Serve's), answering for the block, stopped (SIGTERM) after it."""
    running = Serve(home, **options).wait_up()
    try:
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def emptied_afterwards(home: Path) -> Iterator[Path]:
    """`home` for the block; whatever the backend still runs under it afterwards is deleted."""
    try:
        yield home
    finally:
        remove_everything(home)


@contextlib.contextmanager
def server_on_a_home_of_its_own(tmp_path_factory: pytest.TempPathFactory, name: str,
                                **options: Any) -> Iterator[Serve]:
    """`serving` on a fresh home, emptied once the server has stopped."""
    with emptied_afterwards(tmp_path_factory.mktemp(name)) as home, serving(home, **options) as running:
        yield running


def local_backend(home: Path) -> LocalBackend:
    return LocalBackend.from_config(backend_config("local", home))


def remove_everything(home: Path) -> None:
    """Teardown: whatever the backend still runs under `home` is deleted."""
    async def run() -> None:
        backend = local_backend(home)
        for found in await backend.list_live():
            await backend.delete(found)

    asyncio.run(run())


def leftovers(home: Path, sandbox_ids: set[str]) -> list[str]:
    """What of these sandboxes is still on the machine: directories, run dirs, cgroups."""
    backend = local_backend(home)
    found = []
    for sandbox_id in sandbox_ids:
        paths = backend._paths(sandbox_id)
        found += [str(p) for p in (paths.sandbox_dir, paths.run_dir) if p.exists()]
        found += cgroups.existing_groups(backend._key(sandbox_id))
    return found


def marked_pids(mark: str) -> list[int]:
    """Processes whose environment holds `ORCHARD_TEST_MARK=<mark>`."""
    needle = f"{MARK}={mark}".encode()
    return [pid for pid, environ in environments() if needle in environ]


def db(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(state_db_path(home), timeout=10, isolation_level=None)


def db_ids(home: Path) -> set[str]:
    with contextlib.closing(db(home)) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM sandboxes")}


def assert_refused(response: httpx.Response, *fragments: str) -> str:
    """A 400 `invalid_request` whose message holds every fragment."""
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "invalid_request", body
    for fragment in fragments:
        assert fragment in body["message"], body
    return body["message"]
