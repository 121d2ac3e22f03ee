"""The orchestrator's state: `SandboxStore` on SQLite (a file and `:memory:`) and the liveness of service
instances sharing it. Real SQLite files and real processes."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time

import pytest

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxInfo, SandboxSpec
from orchard.core.backend import BackendSandbox
from orchard.sandbox.server import instances
from orchard.sandbox.server.models import SandboxRecord
from orchard.sandbox.server.store import SCHEMA_VERSION, SandboxStore


def record(sandbox_id: str, *, service: str = "svc-a", state: str = "ready", owner: str = "",
           finished_at: float | None = None, labels: dict | None = None) -> SandboxRecord:
    now = time.time()
    info = SandboxInfo(id=sandbox_id, state=state, spec=SandboxSpec(labels=labels or {}), backend="local",
                       agent_url="unix:///x.sock", token="t", owner=owner, created_at=now,
                       expires_at=now + 60, last_heartbeat=now)
    return SandboxRecord(info=info, backend=BackendSandbox(id=sandbox_id, agent_url="unix:///x.sock",
                                                           handle={"pid": 1, "paths": ["a", "b"]}),
                         service_id=service, finished_at=finished_at)


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path):
    opened = SandboxStore(":memory:" if request.param == "memory" else tmp_path / "state.db")
    yield opened
    opened.close()


def test_records_round_trip_with_their_backend_handle(store):
    original = record("sb-1", labels={"k": "v"})
    store.insert(original)
    assert store.get("sb-1") == original
    assert store.get("sb-unknown") is None
    with pytest.raises(sqlite3.IntegrityError):
        store.insert(original)
    original.info.state = "deleted"
    store.save(original)
    assert store.get("sb-1").info.state == "deleted"
    store.remove("sb-1")
    assert store.get("sb-1") is None


def test_list_filters_by_service_state_and_owner_in_insertion_order(store):
    store.insert(record("sb-1", service="svc-a", owner="alice"))
    store.insert(record("sb-2", service="svc-b", owner="bob", state="creating"))
    store.insert(record("sb-3", service="svc-a", owner="bob", state="deleted", finished_at=1.0))
    assert [r.info.id for r in store.list()] == ["sb-1", "sb-2", "sb-3"]
    assert [r.info.id for r in store.list(service_id="svc-a")] == ["sb-1", "sb-3"]
    assert [r.info.id for r in store.list(owner="bob", states=["creating", "ready"])] == ["sb-2"]
    assert store.count(states=["ready", "creating"]) == 2
    assert store.service_ids_with_sandboxes() == {"svc-a", "svc-b"}


def test_purge_forgets_only_records_finished_before_the_cutoff(store):
    store.insert(record("sb-old", state="deleted", finished_at=100.0))
    store.insert(record("sb-new", state="lost", finished_at=200.0))
    store.insert(record("sb-live"))
    assert store.purge_finished(150.0) == 1
    assert [r.info.id for r in store.list()] == ["sb-new", "sb-live"]


def test_take_over_moves_sandboxes_and_drops_the_dead_instances(store):
    for i, service in enumerate(["svc-dead", "svc-dead", "svc-other"]):
        store.insert(record(f"sb-{i}", service=service))
    store.save_service(instances.new_service_record(ephemeral=False).model_copy(update={"id": "svc-dead"}))
    taken = store.take_over(["svc-dead"], "svc-me")
    assert sorted(r.info.id for r in taken) == ["sb-0", "sb-1"]
    assert all(r.service_id == "svc-me" for r in taken)
    assert [r.info.id for r in store.list(service_id="svc-me")] == ["sb-0", "sb-1"]
    assert store.list_services() == []
    assert store.take_over([], "svc-me") == []


def test_a_file_store_is_private_and_in_wal_mode(tmp_path):
    path = tmp_path / "deep" / "state.db"
    SandboxStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds every sandbox's token
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_store_written_by_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(BackendError, match="newer Orchard"):
        SandboxStore(path)


def test_concurrent_writers_on_one_store_and_two_instances_taking_over_at_once(tmp_path):
    path = tmp_path / "state.db"
    first, second = SandboxStore(path), SandboxStore(path)
    try:
        def insert(prefix: str) -> None:
            for i in range(50):
                first.insert(record(f"sb-{prefix}-{i}", service="svc-dead"))

        threads = [threading.Thread(target=insert, args=(str(n),)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(second.list()) == 300

        results: dict[str, list] = {}
        racers = [threading.Thread(target=lambda s=s, me=me: results.setdefault(me, s.take_over(["svc-dead"], me)))
                  for s, me in ((first, "svc-1"), (second, "svc-2"))]
        for t in racers:
            t.start()
        for t in racers:
            t.join()
        taken = [r.info.id for rs in results.values() for r in rs]
        assert len(taken) == 300 and len(set(taken)) == 300  # every sandbox taken exactly once
    finally:
        first.close()
        second.close()


def test_instance_liveness_follows_its_process_and_its_stop():
    me = instances.new_service_record(ephemeral=True)
    assert not instances.is_alive(me, remote_stale_after_s=60)  # this process, not started
    instances.mark_running(me.id, True)
    try:
        assert instances.is_alive(me, remote_stale_after_s=60)
        assert not instances.is_alive(me.model_copy(update={"stopped": True}), remote_stale_after_s=60)
    finally:
        instances.mark_running(me.id, False)

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = me.model_copy(update={"pid": child.pid, "pid_start": instances.process_start_time(child.pid)})
        assert instances.is_alive(other, remote_stale_after_s=60)
        assert not instances.is_alive(other.model_copy(update={"pid_start": "1"}), remote_stale_after_s=60)
    finally:
        child.kill()
        child.wait()
    assert not instances.is_alive(other, remote_stale_after_s=60)

    remote = me.model_copy(update={"host": "another-host", "pid": os.getpid()})
    assert instances.is_alive(remote, remote_stale_after_s=60)
    assert not instances.is_alive(remote.model_copy(update={"last_seen": time.time() - 120}),
                                  remote_stale_after_s=60)
