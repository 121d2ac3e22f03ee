"""Keeping the store true to the backend: the reaper pass and reconciliation after a (re)start.

- `reap`: delete sandboxes past their TTL (`created_at + spec.timeout_s`) or heartbeat timeout, mark
  those the backend says are dead `lost` (removing their leftovers), retry failed deletions, take over
  sandboxes of dead instances, forget old deleted/lost records.
- `reconcile`: take over the sandboxes of dead instances and settle each against what the backend runs
  (adopt / lost / expired / interrupted create), then delete what the backend runs but the store does not
  know (orphans).
Both also delete the sandboxes of rows the store quarantined as unreadable (quarantine.py)."""

from __future__ import annotations

import asyncio
import logging
import time

from orchard.core.errors import OrchardError
from orchard.core.sandbox import SandboxInfo
from orchard.core.backend import BackendSandbox
from orchard.sandbox.server import instances
from orchard.sandbox.server.models import ReconcileReport, SandboxRecord
from orchard.sandbox.server.pools import member_owner
from orchard.sandbox.server.quarantine import clean_up_quarantined
from orchard.sandbox.server.service_face import ServiceFace

log = logging.getLogger("orchard.sandbox.server")


async def reap(service: ServiceFace) -> list[str]:
    now = time.time()
    service.me.last_seen = now
    service.store.save_service(service.me)
    await take_over_dead_instances(service)
    service.store.purge_finished(now - service.finished_retention_s)
    await clean_up_quarantined(service)
    busy = service.creating.keys() | service.deleting.keys()
    records = [r for r in service.store.list(service_id=service.me.id, states=("ready", "deleting"))
               if r.info.id not in busy]
    results = await asyncio.gather(*(_reap_one(service, r, now) for r in records), return_exceptions=True)
    reaped = []
    for record, result in zip(records, results):
        if isinstance(result, BaseException):
            log.warning("reaping sandbox %s failed (will retry): %s", record.info.id, result)
        elif result:
            reaped.append(record.info.id)
    return reaped


async def reconcile(service: ServiceFace) -> ReconcileReport:
    live = {b.id: b for b in await service.backend.list_live()}
    # Read after list_live: a create inserts its record before the backend makes anything, so a sandbox
    # the backend runs without a record here is truly nobody's. Read before the take-over, which settles
    # (and may delete) the sandboxes it takes.
    known = {r.info.id: r.info.state for r in service.store.list()}
    report = await take_over_dead_instances(service, live)
    orphans = [b for sid, b in live.items() if known.get(sid) in (None, "deleted")]
    results = await asyncio.gather(*(service.backend.delete(b) for b in orphans), return_exceptions=True)
    for orphan, result in zip(orphans, results):
        if isinstance(result, BaseException):
            log.error("could not delete orphan sandbox %s: %s", orphan.id, result)
        else:
            report.orphans_removed.append(orphan.id)
    await clean_up_quarantined(service)
    if any((report.adopted, report.orphans_removed, report.lost, report.expired)):
        log.info("reconciled: adopted %s, lost %s, expired %s, orphans removed %s", report.adopted,
                 report.lost, report.expired, report.orphans_removed)
    return report


async def take_over_dead_instances(service: ServiceFace,
                                   live: dict[str, BackendSandbox] | None = None) -> ReconcileReport:
    """Become responsible for the sandboxes of instances whose process is gone, and settle each."""
    me = service.me.id
    stale_after = max(60.0, 10 * service.reap_interval_s)
    others = {s.id: s for s in service.store.list_services() if s.id != me}
    dead = {sid for sid, s in others.items() if not instances.is_alive(s, remote_stale_after_s=stale_after)}
    dead |= service.store.service_ids_with_sandboxes() - set(others) - {me}  # unregistered: gone
    report = ReconcileReport()
    if not dead:
        return report
    ephemeral = {sid for sid in dead if sid in others and others[sid].ephemeral}
    doomed = service.store.take_over(ephemeral, me)
    inherited = service.store.take_over(dead - ephemeral, me)
    if (doomed or inherited) and live is None:
        live = {b.id: b for b in await service.backend.list_live()}
    now = time.time()
    await asyncio.gather(*(_settle(service, r, live or {}, now, report, adopt=False) for r in doomed),
                         *(_settle(service, r, live or {}, now, report, adopt=True) for r in inherited))
    return report


async def _settle(service: ServiceFace, record: SandboxRecord, live: dict[str, BackendSandbox],
                  now: float, report: ReconcileReport, *, adopt: bool) -> None:
    """Decide the fate of a sandbox whose instance died. `adopt` False: its sandboxes died with it (an
    embedded SDK's process), so whatever still runs is an orphan."""
    info = record.info
    member = info.pool
    try:
        if info.state == "ready" and member is not None and member.idle and info.owner != member_owner(member.name):
            # A pool claim the crash interrupted: its caller never got the sandbox (free its key, so that a
            # retry creates anew), and its agent may hold a token no record has (so it is never handed out).
            service.store.free_idempotency_keys(info.id)
            await service.remove(info.id, "deleted: its pool claim was interrupted (the orchestrator exited)")
            report.orphans_removed.append(info.id)
        elif info.state in ("creating", "ready") and (info.state == "creating" or not adopt):
            if info.state == "creating":
                # Its caller never got it (a create answers once its record is ready): free its idempotency
                # key before removing it, so that the caller's retry with that key creates anew.
                service.store.free_idempotency_keys(info.id)
            if record.backend is None and info.id in live:
                record.backend = live[info.id]
                service.store.save(record)
            await service.remove(info.id, "deleted: the process that created it exited")
            report.orphans_removed.append(info.id)
        elif info.state == "deleting":
            await service.remove(info.id, info.error)
        elif info.state == "ready" and now >= info.expires_at:
            await service.remove(info.id, expiry_reason(info, now))
            report.expired.append(info.id)
        elif info.state == "ready" and info.id in live:
            # Heartbeats could not reach a dead orchestrator: their clock restarts on adoption.
            info.last_heartbeat = max(info.last_heartbeat, now)
            service.store.save(record)
            report.adopted.append(info.id)
        elif info.state == "ready":
            await service.remove(info.id, "lost: it was no longer running when the orchestrator restarted; "
                                 "create a new sandbox", final_state="lost")
            report.lost.append(info.id)
    except OrchardError as e:
        log.error("could not settle sandbox %s after taking it over: %s", info.id, e)


async def _reap_one(service: ServiceFace, record: SandboxRecord, now: float) -> bool:
    info = record.info
    if info.state == "deleting":  # an earlier deletion failed
        await service.remove(info.id, info.error)
        return False
    reason = expiry_reason(info, now)
    if reason:
        await service.remove(info.id, reason)
        return True
    if record.backend is not None and not await service.backend.is_alive(record.backend):
        current = service.store.get(info.id)
        if current is not None and current.info.state == "ready":  # not deleted meanwhile
            await service.remove(info.id, "lost: its processes exited or were killed; create a new sandbox",
                                 final_state="lost")
    return False


def expiry_reason(info: SandboxInfo, now: float) -> str | None:
    if now >= info.expires_at:
        return f"deleted: its TTL expired (timeout_s={info.spec.timeout_s:g} s after creation)"
    hb = info.spec.heartbeat_timeout_s
    if hb is not None and now - info.last_heartbeat > hb:
        return f"deleted: no heartbeat for {hb:g} s (heartbeat_timeout_s)"
    return None
