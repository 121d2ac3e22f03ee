"""`SandboxStore`'s transactions for admission (see admission.py): the caps checked and a record inserted
in one write transaction, idempotency keys, the re-owning of a claimed pool member, and the eviction of
idle pool members for creates waiting for a place. A mixin: `SandboxStore` provides `_lock` and `_db`.

Creates waiting at the server cap are rows of `waiting_creates` (shared by every orchestrator on the store,
each row expiring at its create's deadline, so a crashed instance's rows need no cleanup): member starts
yield to them, and idle members are evicted for them, never more at once than creates wait for a place
that is not already free or being freed (`evictions`)."""

from __future__ import annotations

import sqlite3
import threading
from typing import Iterable

from orchard.sandbox.server.models import Admitted, AdmissionRules, Reowned, SandboxRecord

POOL_OWNER_SQL = "owner LIKE 'pool:%'"  # a pool's unclaimed members (pools.member_owner), idle or not


def idle_member_sql(t: str) -> str:
    """An idle pool member of table alias `t`: ready, still owned by its pool (a claim re-owns it first)."""
    return f"{t}.state = 'ready' AND {t}.owner LIKE 'pool:%' AND json_extract({t}.record, '$.info.pool.idle') = 1"


def record_row(record: SandboxRecord) -> tuple:
    info = record.info
    return (info.id, record.service_id, info.state, info.owner, record.finished_at, record.model_dump_json())


class AdmissionStore:
    _lock: threading.Lock
    _db: sqlite3.Connection

    def admit(self, record: SandboxRecord, rules: AdmissionRules, now: float) -> Admitted:
        """Insert a new sandbox's record if `rules` allow it, in one transaction that holds the database's
        write lock from the count to the insert, so that no other create (of this process or another
        orchestrator sharing the file) can slip in between: the caps cannot be exceeded. In order: an
        idempotency key already used answers with its sandbox (or a conflict), then the caps on live
        sandboxes, then the create rate (a token bucket kept here, shared by every instance)."""
        states = list(rules.live_states)
        marks = ",".join("?" * len(states))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = self._admit_locked(record, rules, now, states, marks)
                self._db.execute("COMMIT" if result.outcome == "admitted" else "ROLLBACK")
                return result
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _admit_locked(self, record: SandboxRecord, rules: AdmissionRules, now: float, states: list[str],
                      marks: str) -> Admitted:
        info = record.info
        if rules.idempotency_key is not None:
            row = self._db.execute("SELECT fingerprint, sandbox_id FROM idempotency WHERE owner = ? AND key = ?",
                                   (info.owner, rules.idempotency_key)).fetchone()
            if row is not None:
                return Admitted(outcome="existing" if row[0] == rules.fingerprint else "conflict",
                                sandbox_id=row[1])
        live = self._db.execute(f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({marks})", states).fetchone()[0]
        full = rules.max_sandboxes is not None and live >= rules.max_sandboxes
        if not full and rules.yield_to_waiting:  # a pool member's start never takes a waiting create's place
            full = self._db.execute("SELECT COUNT(*) FROM waiting_creates WHERE until > ?", (now,)).fetchone()[0] > 0
        if full:
            members = self._db.execute(f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({marks}) AND {POOL_OWNER_SQL}",
                                       states).fetchone()[0]
            return Admitted(outcome="full", cap="server", live=live, pool_members=members)
        if rules.max_per_owner is not None:
            mine = self._db.execute(f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({marks}) AND owner = ?",
                                    [*states, info.owner]).fetchone()[0]
            if mine >= rules.max_per_owner:
                return Admitted(outcome="full", cap="owner", live=mine)
        if rules.rate_per_s is not None:
            row = self._db.execute("SELECT tokens, updated FROM create_rate WHERE id = 0").fetchone()
            burst = float(rules.rate_burst)
            tokens = burst if row is None else min(burst, row[0] + max(0.0, now - row[1]) * rules.rate_per_s)
            if tokens < 1.0:
                return Admitted(outcome="full", cap="rate", live=live,
                                retry_after_s=(1.0 - tokens) / rules.rate_per_s)
            self._db.execute("INSERT OR REPLACE INTO create_rate (id, tokens, updated) VALUES (0, ?, ?)",
                             (tokens - 1.0, now))
        self._db.execute(
            "INSERT INTO sandboxes (id, service_id, state, owner, finished_at, record) VALUES (?,?,?,?,?,?)",
            record_row(record))
        if rules.idempotency_key is not None:
            self._db.execute("INSERT INTO idempotency (owner, key, fingerprint, sandbox_id) VALUES (?,?,?,?)",
                             (info.owner, rules.idempotency_key, rules.fingerprint, info.id))
        self._db.execute("DELETE FROM waiting_creates WHERE id = ?", (info.id,))  # no longer waiting, at once
        return Admitted(outcome="admitted", sandbox_id=info.id, live=live + 1)

    def reown_within_cap(self, sandbox_id: str, *, from_owner: str, to_owner: str, live_states: Iterable[str],
                         max_per_owner: int | None, idempotency_key: str | None = None,
                         fingerprint: str | None = None) -> Reowned:
        """Give a ready sandbox of `from_owner` (an idle pool member) to `to_owner` unless that takes
        `to_owner` past `max_per_owner` live sandboxes, binding `idempotency_key` to it: one transaction
        holding the write lock from the count to the update, so that orchestrators sharing the file cannot
        together exceed the cap (as `admit`). Only the owner changes; the caller rewrites the rest."""
        states = list(live_states)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = self._reown_locked(sandbox_id, from_owner, to_owner, states, max_per_owner,
                                            idempotency_key, fingerprint)
                self._db.execute("COMMIT" if result.outcome == "reowned" else "ROLLBACK")
                return result
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _reown_locked(self, sandbox_id: str, from_owner: str, to_owner: str, states: list[str],
                      max_per_owner: int | None, key: str | None, fingerprint: str | None) -> Reowned:
        row = self._db.execute("SELECT record FROM sandboxes WHERE id = ? AND state = 'ready' AND owner = ?",
                               (sandbox_id, from_owner)).fetchone()
        if row is None:
            return Reowned(outcome="gone")
        if key is not None:
            bound = self._db.execute("SELECT sandbox_id FROM idempotency WHERE owner = ? AND key = ?",
                                     (to_owner, key)).fetchone()
            if bound is not None:
                return Reowned(outcome="key_taken", sandbox_id=bound[0])
        if max_per_owner is not None:
            mine = self._db.execute(f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({','.join('?' * len(states))}) "
                                    "AND owner = ?", [*states, to_owner]).fetchone()[0]
            if mine >= max_per_owner:
                return Reowned(outcome="over_cap", live=mine)
        record = SandboxRecord.model_validate_json(row[0])
        record.info.owner = to_owner
        self._db.execute("UPDATE sandboxes SET owner = ?, record = ? WHERE id = ?",
                         (to_owner, record.model_dump_json(), sandbox_id))
        if key is not None:
            self._db.execute("INSERT INTO idempotency (owner, key, fingerprint, sandbox_id) VALUES (?,?,?,?)",
                             (to_owner, key, fingerprint, sandbox_id))
        return Reowned(outcome="reowned", sandbox_id=sandbox_id)

    def release_claim(self, sandbox_id: str, *, owner: str, pool_owner: str) -> None:
        """Undo `reown_within_cap` for a claim that failed: the key is freed and the member, if still ready
        and `owner`'s, is the pool's again (so it stops counting against `owner` while it is deleted)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM idempotency WHERE sandbox_id = ?", (sandbox_id,))
                row = self._db.execute("SELECT record FROM sandboxes WHERE id = ? AND state = 'ready' AND owner = ?",
                                       (sandbox_id, owner)).fetchone()
                if row is not None:
                    record = SandboxRecord.model_validate_json(row[0])
                    record.info.owner = pool_owner
                    self._db.execute("UPDATE sandboxes SET owner = ?, record = ? WHERE id = ?",
                                     (pool_owner, record.model_dump_json(), sandbox_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def free_idempotency_keys(self, sandbox_id: str) -> int:
        """Unbind every key naming `sandbox_id`, a create that never reached its caller (interrupted, or
        failed), so that the caller's retry with its key creates anew; returns how many were bound."""
        with self._lock:
            return self._db.execute("DELETE FROM idempotency WHERE sandbox_id = ?", (sandbox_id,)).rowcount

    def idempotency_target(self, owner: str, key: str) -> str | None:
        """The sandbox an owner's idempotency key names now, or None when it names none."""
        rows = self._read("SELECT sandbox_id FROM idempotency WHERE owner = ? AND key = ?", (owner, key))
        return rows[0][0] if rows else None


    # --- creates waiting at the server cap, and evictions of idle pool members for them -----------------

    def set_waiting(self, create_id: str, until: float) -> None:
        """Record that create `create_id` waits for a place under the server cap, until `until` (wall clock)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO waiting_creates (id, until) VALUES (?, ?)", (create_id, until))

    def clear_waiting(self, create_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM waiting_creates WHERE id = ?", (create_id,))

    def waiting_count(self, now: float) -> int:
        """Creates waiting for a place under the server cap now, on every orchestrator sharing the store."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM waiting_creates WHERE until > ?", (now,)).fetchone()[0]

    def evict_idle_member(self, service_id: str, *, live_states: Iterable[str], max_sandboxes: int, now: float,
                          reason: str) -> SandboxRecord | None:
        """Mark one idle pool member of `service_id` `deleting` (the caller then deletes it) when creates wait
        for a place that is neither free nor being freed by an eviction in flight; None when none is needed
        or there is none to evict. One write transaction, so orchestrators sharing the store never evict
        together more than the creates waiting. The member taken is of the pool with the most idle members
        (of this instance), the oldest of them. Its place counts until the backend deleted it."""
        states = list(live_states)
        marks = ",".join("?" * len(states))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                record = self._evict_locked(service_id, states, marks, max_sandboxes, now, reason)
                self._db.execute("COMMIT" if record is not None else "ROLLBACK")
                return record
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _evict_locked(self, service_id: str, states: list[str], marks: str, max_sandboxes: int, now: float,
                      reason: str) -> SandboxRecord | None:
        db = self._db
        waiting = db.execute("SELECT COUNT(*) FROM waiting_creates WHERE until > ?", (now,)).fetchone()[0]
        if waiting == 0:
            return None
        db.execute("DELETE FROM waiting_creates WHERE until <= ?", (now,))
        db.execute(f"DELETE FROM evictions WHERE sandbox_id NOT IN (SELECT id FROM sandboxes WHERE state IN ({marks}))",
                   states)
        in_flight = db.execute("SELECT COUNT(*) FROM evictions").fetchone()[0]
        live = db.execute(f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({marks})", states).fetchone()[0]
        if waiting - max(0, max_sandboxes - live) - in_flight <= 0:
            return None
        row = db.execute(
            f"SELECT s.id, s.record FROM sandboxes s WHERE s.service_id = ? AND {idle_member_sql('s')} "
            "ORDER BY (SELECT COUNT(*) FROM sandboxes t WHERE t.service_id = s.service_id AND t.owner = s.owner AND "
            f"{idle_member_sql('t')}) DESC, json_extract(s.record, '$.info.created_at'), s.rowid LIMIT 1",
            (service_id,)).fetchone()
        if row is None:
            return None
        record = SandboxRecord.model_validate_json(row[1])
        record.info.state, record.info.error = "deleting", reason
        db.execute("UPDATE sandboxes SET state = ?, record = ? WHERE id = ?",
                   (record.info.state, record.model_dump_json(), row[0]))
        db.execute("INSERT OR REPLACE INTO evictions (sandbox_id, since) VALUES (?, ?)", (row[0], now))
        return record
