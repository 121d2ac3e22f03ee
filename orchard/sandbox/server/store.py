"""`SandboxStore`: the orchestrator's state in SQLite (a file, or `:memory:`).

One connection guarded by a lock: every call is a short synchronous statement, so async callers use it
directly. WAL lets other processes that share the file (another orchestrator instance on the same home)
read while one writes; `busy_timeout` makes concurrent writers wait instead of failing.

A row that cannot be read back (corrupt, or refused by this version's validation) never stops the
service: it is logged and moved to the `quarantine` table on the read that finds it, and the rest is
served (see quarantine.py for how its sandbox is then deleted)."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable

from orchard.core.errors import BackendError
from orchard.sandbox.server.models import QuarantinedRow, SandboxRecord, ServiceRecord
from orchard.sandbox.server.store_admission import AdmissionStore, record_row

log = logging.getLogger("orchard.sandbox.server")

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
CREATE INDEX IF NOT EXISTS sandboxes_by_state ON sandboxes (state, owner);
CREATE TABLE IF NOT EXISTS idempotency (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    PRIMARY KEY (owner, key)
);
-- A key lives as long as its sandbox's record (through deletion and retention), never longer.
CREATE TRIGGER IF NOT EXISTS idempotency_expires AFTER DELETE ON sandboxes
BEGIN DELETE FROM idempotency WHERE sandbox_id = OLD.id; END;
CREATE TABLE IF NOT EXISTS create_rate (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    tokens REAL NOT NULL,
    updated REAL NOT NULL
);
-- Creates waiting for a place under the server cap (any instance), and idle pool members evicted for them
-- (store_admission.py). A waiting row expires at its create's deadline.
CREATE TABLE IF NOT EXISTS waiting_creates (
    id TEXT PRIMARY KEY,
    until REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS evictions (
    sandbox_id TEXT PRIMARY KEY,
    since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS services (
    id TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    record TEXT NOT NULL,
    reason TEXT NOT NULL,
    quarantined_at REAL NOT NULL,
    cleaned_up INTEGER NOT NULL DEFAULT 0
);
"""


class SandboxStore(AdmissionStore):
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
            record_row(record))

    def count_by_owner(self, *, states: Iterable[str]) -> dict[str, int]:
        states = list(states)
        rows = self._read(f"SELECT owner, COUNT(*) FROM sandboxes WHERE state IN ({','.join('?' * len(states))}) "
                          "GROUP BY owner ORDER BY owner", tuple(states))
        return {owner: n for owner, n in rows}

    def save(self, record: SandboxRecord) -> None:
        """Write the record (insert or replace)."""
        self._write(
            "INSERT OR REPLACE INTO sandboxes (id, service_id, state, owner, finished_at, record) "
            "VALUES (?,?,?,?,?,?)", record_row(record))

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
        """The record, or None when there is none (or it was unreadable and got quarantined)."""
        records = self._sandboxes(self._read("SELECT id, record FROM sandboxes WHERE id = ?", (sandbox_id,)))
        return records[0] if records else None

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
        sql = "SELECT id, record FROM sandboxes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return self._sandboxes(self._read(sql + " ORDER BY rowid", tuple(args)))

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
                    f"SELECT id, record FROM sandboxes WHERE service_id IN ({marks})", ids).fetchall()
                taken = []
                for row_id, raw in rows:
                    try:
                        record = SandboxRecord.model_validate_json(raw)
                    except ValueError as e:
                        self._quarantine_locked("sandbox", row_id, raw, e)
                        continue
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
        services = []
        for service_id, raw in self._read("SELECT id, record FROM services", ()):
            try:
                services.append(ServiceRecord.model_validate_json(raw))
            except ValueError as e:
                self._quarantine("service", service_id, raw, e)
        return services

    def remove_service(self, service_id: str) -> None:
        self._write("DELETE FROM services WHERE id = ?", (service_id,))

    # --- quarantine of unreadable rows ------------------------------------------------------------------

    def quarantined(self, *, kind: str | None = None, sandbox_id: str | None = None,
                    pending_only: bool = False) -> list[QuarantinedRow]:
        """Quarantined rows, oldest first; `pending_only`: those whose sandbox is not cleaned up yet."""
        sql = "SELECT seq, kind, id, record, reason, quarantined_at, cleaned_up FROM quarantine WHERE 1"
        args: list = []
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        if sandbox_id is not None:
            sql += " AND id = ?"
            args.append(sandbox_id)
        if pending_only:
            sql += " AND cleaned_up = 0"
        rows = self._read(sql + " ORDER BY seq", tuple(args))
        return [QuarantinedRow(seq=r[0], kind=r[1], id=r[2], record=r[3], reason=r[4], quarantined_at=r[5],
                               cleaned_up=bool(r[6])) for r in rows]

    def mark_cleaned_up(self, seq: int) -> None:
        self._write("UPDATE quarantine SET cleaned_up = 1 WHERE seq = ?", (seq,))

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

    def _sandboxes(self, rows: list[tuple]) -> list[SandboxRecord]:
        """(id, record JSON) rows as records; unreadable ones are quarantined and left out."""
        records = []
        for row_id, raw in rows:
            try:
                records.append(SandboxRecord.model_validate_json(raw))
            except ValueError as e:
                self._quarantine("sandbox", row_id, raw, e)
        return records

    def _quarantine(self, kind: str, row_id: str, raw: str, error: ValueError) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._quarantine_locked(kind, row_id, raw, error)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _quarantine_locked(self, kind: str, row_id: str, raw: str, error: ValueError) -> None:
        """Move one unreadable row to `quarantine` (inside the caller's transaction). Only the row as it
        was read is moved: if someone rewrote it meanwhile, the new version stays."""
        table = "sandboxes" if kind == "sandbox" else "services"
        removed = self._db.execute(f"DELETE FROM {table} WHERE id = ? AND record = ?", (row_id, raw)).rowcount
        if not removed:
            return
        reason = " ".join(str(error).split())[:2000]
        self._db.execute("INSERT INTO quarantine (kind, id, record, reason, quarantined_at) VALUES (?,?,?,?,?)",
                         (kind, row_id, raw, reason, time.time()))
        log.error("the stored %s %s is unreadable and was moved to the quarantine table of %s (the rest is "
                  "served as usual; its sandbox is deleted): %s", kind, row_id, self.path, reason)


def _create_private_file(path: Path) -> None:
    """The database holds every sandbox's token: create it (and its directory) readable by us only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    except OSError as e:
        raise BackendError(f"cannot create the sandbox state database {path}: {e}") from e
