"""`orchard serve` SIGKILLed while creates are in flight: the next server on the same home must remove
everything those creates left (sandbox directories, run directories, cgroups, processes) at its startup
reconcile, not some later restart. Performed on a real server, real sandboxes, a real SIGKILL."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx

from orchard.core.sandbox import SandboxInfo, SandboxSpec
from orchard.sandbox.backends.local import cgroups
from orchard.sandbox.server.home import state_db_path
from orchard.sandbox.server.models import SandboxRecord
from orchard.sandbox.server.store import SandboxStore
from tests.security.serve_process import (API_KEY, MARK, Serve, db_ids, leftovers, local_backend,
                                          marked_pids, remove_everything, wait_for)

CREATES = 6


def _create_forever(url: str, mark: str, stop: threading.Event) -> None:
    """Creates one after another until the server dies under them."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as api:
        while not stop.is_set():
            try:
                api.post("/v1/sandboxes", json={"env": {MARK: mark}})
            except httpx.TransportError:
                return


def test_a_server_killed_mid_create_leaves_nothing_after_a_restart(tmp_path):
    mark = uuid.uuid4().hex
    server = Serve(tmp_path).wait_up()
    stop = threading.Event()
    creators = [threading.Thread(target=_create_forever, args=(server.url, mark, stop)) for _ in range(CREATES)]
    try:
        for thread in creators:
            thread.start()
        # Kill once creates are surely in flight: several records exist, and some are still `creating`.
        sandboxes = tmp_path / "sandboxes"
        wait_for(lambda: len(db_ids(tmp_path)) >= CREATES + 2 and sandboxes.is_dir()
                 and len(list(sandboxes.iterdir())) >= 2, 120, "creates in flight")
        server.kill()
        stop.set()
        for thread in creators:
            thread.join(timeout=60)
        made = db_ids(tmp_path)

        server = Serve(tmp_path).wait_up()  # its startup reconcile must clean up
        with server.client() as api:
            for info in api.get("/v1/sandboxes").json()["sandboxes"]:  # adopted ones are fine: delete them
                assert info["state"] == "ready", info
                api.delete(f"/v1/sandboxes/{info['id']}")
        assert leftovers(tmp_path, made) == []
        assert list(sandboxes.iterdir()) == []
        wait_for(lambda: not marked_pids(mark), 10, "every sandbox process to be gone")
    finally:
        stop.set()
        server.stop()
        remove_everything(tmp_path)


def test_what_a_create_leaves_before_its_first_record_is_removed_at_startup(tmp_path):
    """The narrowest window, which a SIGKILL hits only by chance: the store has the `creating` record of a
    server that is gone, and the backend has made the sandbox's directory, run directory and cgroups but
    not yet its meta.json. That state is made here with the backend's own paths and cgroup code; the
    next server's startup reconcile (done before it answers /healthz) must remove all of it."""
    backend = local_backend(tmp_path)
    sandbox_id = f"sb-{uuid.uuid4().hex[:12]}"
    paths = backend._paths(sandbox_id)
    backend._ensure_run_base()
    paths.sandbox_dir.mkdir(parents=True)
    (paths.sandbox_dir / "rw" / "workspace").mkdir(parents=True)
    paths.run_dir.mkdir(parents=True)
    made_groups = cgroups.create_cgroups(backend._key(sandbox_id), SandboxSpec(memory_mb=64))
    now = time.time()
    info = SandboxInfo(id=sandbox_id, state="creating", spec=SandboxSpec(), backend="local", token="t",
                       created_at=now, expires_at=now + 600, last_heartbeat=now)
    store = SandboxStore(state_db_path(tmp_path))
    store.insert(SandboxRecord(info=info, service_id="svc-gone"))
    store.close()
    assert leftovers(tmp_path, {sandbox_id}), "the half-made sandbox should exist before the restart"

    server = Serve(tmp_path).wait_up()
    try:
        assert leftovers(tmp_path, {sandbox_id}) == []
        if made_groups is not None:
            assert not any(Path(group).exists() for group in made_groups.paths)
        with server.client() as api:
            assert api.get(f"/v1/sandboxes/{sandbox_id}").json()["state"] == "deleted"
    finally:
        server.stop()
        remove_everything(tmp_path)
