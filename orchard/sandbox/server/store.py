"""`SandboxStore`: the orchestrator's state in SQLite (a file, or `:memory:`).

One connection guarded by a lock: every call is a short synchronous statement, so async callers use it
directly. WAL lets other processes that share the file (another orchestrator instance on the same home)
read while one writes; `busy_timeout` makes concurrent writers wait instead of failing."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Iterable

from orchard.core.errors import BackendError
from orchard.sandbox.server.models import SandboxRecord, ServiceRecord

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    service_id TEXT NOT NULL,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    finished_at REAL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_by_service ON sandboxes (service_id, state);
CREATE TABLE IF NOT EXISTS services (
    id TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
"""


class SandboxStore:
    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        if self.path != ":memory:":
            _create_private_file(Path(self.path))
        try:
            # check_same_thread=False: the lock, not the thread, serialises use of the connection.
            self._db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise BackendError(f"cannot open the sandbox state database {self.path}: {e}") from e
        try:
            self._init_schema()
        except BaseException:
            self._db.close()
            raise

    def _init_schema(self) -> None:
        with self._lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise BackendError(
                    f"the sandbox state database {self.path} was written by a newer Orchard (schema "
                    f"{version}, this one knows {SCHEMA_VERSION}); upgrade Orchard or use another home")
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
                # NORMAL is durable across process crashes in WAL mode; only power loss may drop the
                # last commits, which reconciliation then repairs.
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # --- sandboxes -------------------------------------------------------------------------------------

    def insert(self, record: SandboxRecord) -> None:
        """Add a new sandbox; its id must be new."""
        self._write(
            "INSERT INTO sandboxes (id, service_id, state, owner, finished_at, record) VALUES (?,?,?,?,?,?)",
            _row(record))

    def save(self, record: SandboxRecord) -> None:
        """Write the record (insert or replace)."""
        self._write(
            "INSERT OR REPLACE INTO sandboxes (id, service_id, state, owner, finished_at, record) "
            "VALUES (?,?,?,?,?,?)", _row(record))

    def update_if_state(self, record: SandboxRecord, state: str) -> bool:
        """Write the record only while its stored state is still `state`, in one statement (nothing can
        change it in between); False when the row is gone or has moved on."""
        info = record.info
        with self._lock:
            cursor = self._db.execute(
                "UPDATE sandboxes SET service_id = ?, state = ?, owner = ?, finished_at = ?, record = ? "
                "WHERE id = ? AND state = ?",
                (record.service_id, info.state, info.owner, record.finished_at, record.model_dump_json(),
                 info.id, state))
            return cursor.rowcount == 1

    def get(self, sandbox_id: str) -> SandboxRecord | None:
        rows = self._read("SELECT record FROM sandboxes WHERE id = ?", (sandbox_id,))
        return SandboxRecord.model_validate_json(rows[0][0]) if rows else None

    def list(self, *, service_id: str | None = None, states: Iterable[str] | None = None,
             owner: str | None = None) -> list[SandboxRecord]:
        """Records matching every filter given, oldest first."""
        where, args = [], []
        if service_id is not None:
            where.append("service_id = ?")
            args.append(service_id)
        if owner is not None:
            where.append("owner = ?")
            args.append(owner)
        if states is not None:
            states = list(states)
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        sql = "SELECT record FROM sandboxes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._read(sql + " ORDER BY rowid", tuple(args))
        return [SandboxRecord.model_validate_json(r[0]) for r in rows]

    def count(self, *, states: Iterable[str]) -> int:
        states = list(states)
        rows = self._read(f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({','.join('?' * len(states))})",
                          tuple(states))
        return rows[0][0]

    def remove(self, sandbox_id: str) -> None:
        self._write("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))

    def purge_finished(self, before: float) -> int:
        """Drop deleted/lost records that finished before `before`; returns how many."""
        with self._lock:
            return self._db.execute(
                "DELETE FROM sandboxes WHERE finished_at IS NOT NULL AND finished_at < ?", (before,)).rowcount

    def take_over(self, from_service_ids: Iterable[str], to_service_id: str) -> list[SandboxRecord]:
        """Make `to_service_id` responsible for every sandbox of the given services, atomically (two
        instances taking over at once never both get a row). Returns the records taken."""
        ids = list(from_service_ids)
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute(
                    f"SELECT record FROM sandboxes WHERE service_id IN ({marks})", ids).fetchall()
                taken = []
                for (raw,) in rows:
                    record = SandboxRecord.model_validate_json(raw)
                    record.service_id = to_service_id
                    self._db.execute("UPDATE sandboxes SET service_id = ?, record = ? WHERE id = ?",
                                     (to_service_id, record.model_dump_json(), record.info.id))
                    taken.append(record)
                self._db.execute(f"DELETE FROM services WHERE id IN ({marks})", ids)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return taken

    def service_ids_with_sandboxes(self) -> set[str]:
        return {r[0] for r in self._read("SELECT DISTINCT service_id FROM sandboxes", ())}

    # --- service instances -----------------------------------------------------------------------------

    def save_service(self, service: ServiceRecord) -> None:
        self._write("INSERT OR REPLACE INTO services (id, record) VALUES (?, ?)",
                    (service.id, service.model_dump_json()))

    def list_services(self) -> list[ServiceRecord]:
        return [ServiceRecord.model_validate_json(r[0]) for r in self._read("SELECT record FROM services", ())]

    def remove_service(self, service_id: str) -> None:
        self._write("DELETE FROM services WHERE id = ?", (service_id,))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- helpers ---------------------------------------------------------------------------------------

    def _write(self, sql: str, args: tuple) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def _read(self, sql: str, args: tuple) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()


def _row(record: SandboxRecord) -> tuple:
    info = record.info
    return (info.id, record.service_id, info.state, info.owner, record.finished_at, record.model_dump_json())


def _create_private_file(path: Path) -> None:
    """The database holds every sandbox's token: create it (and its directory) readable by us only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    except OSError as e:
        raise BackendError(f"cannot create the sandbox state database {path}: {e}") from e
