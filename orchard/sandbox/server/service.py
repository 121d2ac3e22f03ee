"""`SandboxService`: the orchestrator's logic, used in-process by the embedded SDK and behind the REST app.

It creates sandboxes through a backend, keeps their state in a `SandboxStore`, and (upkeep.py) reaps those
past their TTL or heartbeat timeout, notices those that died and, at start, reconciles the store with what
the backend still runs. A record goes `creating` → `ready` → `deleting` → `deleted`; one found dead becomes
`lost` (its leftovers are removed at once). A failed create leaves no record. `deleted` and `lost` records
are kept `finished_retention_s` so that clients learn what happened (`error` says why), then forgotten.

Several instances may share one store (see instances.py): each manages the sandboxes it created or took
over from a dead instance, so one instance stopping with `delete_all` never touches another's sandboxes."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from pathlib import Path
from typing import Any

from orchard.core.errors import BackendError, OrchardError, SandboxLost, SandboxNotFound
from orchard.core.backend import Backend, BackendConfig, BackendSandbox
from orchard.core.pool import PoolSpec, PoolsConfig
from orchard.core.sandbox import SandboxInfo, SandboxPoolInfo, SandboxSpec
from orchard.sandbox.backends.registry import create_backend
from orchard.sandbox.server import instances, upkeep
from orchard.sandbox.server.admission import Admission, CapsStats, CreateCaps
from orchard.sandbox.server.create_steps import new_sandbox_id, startup_timings, validated_spec
from orchard.sandbox.server.home import resolve_home, resolved_backend_config, state_db_path
from orchard.sandbox.server.models import ReconcileReport, SandboxRecord
from orchard.sandbox.server.pools import PoolManager, check_caller_owner
from orchard.sandbox.server.service_face import CreateInFlight
from orchard.sandbox.server.spec_limits import SpecLimits, spec_limits
from orchard.sandbox.server.store import SandboxStore

log = logging.getLogger("orchard.sandbox.server")

ACTIVE_STATES = ("creating", "ready", "deleting")
VISIBLE_STATES = ("creating", "ready", "deleting", "lost")


class SandboxService:
    def __init__(self, backend: Backend, store: SandboxStore, *, reap_interval_s: float = 2.0,
                 finished_retention_s: float = 3600.0, ephemeral: bool = False,
                 create_drain_timeout_s: float = 120.0, limits: SpecLimits | None = None,
                 caps: CreateCaps | None = None, pools: PoolsConfig | list[PoolSpec] | None = None) -> None:
        """Takes ownership of `backend` and `store`: `stop()` closes both. A backend's sandboxes must be
        paired with one store (reconcile deletes what the store does not know). `ephemeral`: this
        instance's sandboxes die with it, so if its process dies, the next instance deletes them instead
        of adopting them (the embedded SDK). `limits`: the most a spec may ask for (default: only the
        TTL maximum; `embedded()` and `serve()` use this machine's, see spec_limits.py). `caps`: the most
        live sandboxes in all and per owner, and the create rate (default none; see admission.py). `pools`:
        warm pools of pre-started sandboxes that matching creates claim (see pools.py)."""
        self.backend = backend
        self.store = store
        self.admission = Admission(store, caps, ACTIVE_STATES, closing=lambda: self._closing,
                                   relieve=lambda: self.pools.relieve())
        self.limits = limits if limits is not None else SpecLimits()
        self.reap_interval_s = reap_interval_s
        self.finished_retention_s = finished_retention_s
        self.create_drain_timeout_s = create_drain_timeout_s
        self.me = instances.new_service_record(ephemeral=ephemeral)
        self.creating: dict[str, CreateInFlight] = {}  # sandbox id → its create() in progress
        self.deleting: dict[str, asyncio.Task] = {}    # sandbox id → the one task deleting it
        self._reaper: asyncio.Task | None = None
        self._started = self._closing = self._stopped = False
        try:
            self.pools = PoolManager(self, pools)
        except BaseException:  # a pool this orchestrator cannot run: refused before anything started
            store.close()
            raise

    @classmethod
    def embedded(cls, home: Path | None = None, *, backend: BackendConfig | str | None = None,
                 **options: Any) -> "SandboxService":
        """`backend` (a config or a backend's name; default the local backend) with the state under `home`
        (default `$ORCHARD_HOME`, else `~/.orchard`); its sandboxes die with this process."""
        home = resolve_home(home)
        config = resolved_backend_config(backend, home)
        options.setdefault("limits", spec_limits(config, home))
        return cls(create_backend(config), SandboxStore(state_db_path(home)), **{"ephemeral": True, **options})

    # --- lifecycle of the service ----------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Whether the service is stopping (it takes no more creates)."""
        return self._closing

    async def start(self) -> ReconcileReport:
        """Register this instance, reconcile with the backend, then reap in the background."""
        if self._started:
            raise BackendError("this sandbox service was already started; create a new one to restart")
        self._started = True
        self.store.save_service(self.me)
        instances.mark_running(self.me.id, True)
        try:
            report = await self.reconcile()
        except BaseException:
            instances.mark_running(self.me.id, False)
            self.store.remove_service(self.me.id)
            raise
        self._reaper = asyncio.create_task(self._reap_forever(), name=f"orchard-reaper-{self.me.id}")
        await self.pools.start()
        return report

    async def stop(self, *, delete_all: bool = False) -> None:
        """Stop reaping and close the backend and store. Sandboxes survive (a restarted service re-adopts
        them) unless `delete_all`, which deletes every sandbox this instance manages."""
        if self._stopped:
            return
        self._stopped = self._closing = True
        await self._stop_reaper()
        await self.pools.stop()
        await self._drain_creates()
        try:
            if delete_all:
                records = self.store.list(service_id=self.me.id, states=VISIBLE_STATES)
                results = await asyncio.gather(
                    *(self.remove(r.info.id, "deleted: the orchestrator stopped") for r in records),
                    return_exceptions=True)
                for record, result in zip(records, results):
                    if isinstance(result, BaseException):
                        log.error("could not delete sandbox %s while stopping: %s", record.info.id, result)
            here = asyncio.get_running_loop()
            await asyncio.gather(*[t for t in self.deleting.values() if t.get_loop() is here],
                                 return_exceptions=True)
            # With sandboxes left, the record stays: it tells the next instance whether to adopt them.
            if self._started and not self.store.list(service_id=self.me.id, states=ACTIVE_STATES):
                self.store.remove_service(self.me.id)
            elif self._started:
                self.store.save_service(self.me.model_copy(update={"stopped": True}))
        finally:
            instances.mark_running(self.me.id, False)
            try:
                await self.backend.close()
            finally:
                self.store.close()

    async def _stop_reaper(self) -> None:
        # The embedded SDK may stop the service from another event loop than the one that started it
        # (at process exit, after that loop closed): never touch a closed loop, never await across loops.
        reaper, self._reaper = self._reaper, None
        if reaper is None or reaper.done() or reaper.get_loop().is_closed():
            return
        if reaper.get_loop() is asyncio.get_running_loop():
            reaper.cancel()
            await asyncio.gather(reaper, return_exceptions=True)
        else:
            reaper.get_loop().call_soon_threadsafe(reaper.cancel)

    async def _drain_creates(self) -> None:
        """Let creates in flight finish, so that `delete_all` sees (and deletes) what they make. A create
        whose event loop closed will never finish: the next instance settles what it left."""
        deadline = time.monotonic() + self.create_drain_timeout_s
        while (any(not c.loop.is_closed() for c in self.creating.values())
               and time.monotonic() < deadline):
            await asyncio.sleep(0.05)

    # --- the API -----------------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec | dict, *, owner: str = "",
                     idempotency_key: str | None = None, pool: str | None = None,
                     max_per_owner: int | None = None, _pool_member: SandboxPoolInfo | None = None) -> SandboxInfo:
        """Create a sandbox and return it ready, with `agent_url` and `token`. On any failure nothing is
        left: the backend's sandbox is deleted and the record removed. Over a cap it waits (admission.py);
        with an `idempotency_key` this owner already used, it returns that create's sandbox instead (waiting
        for it while it is being created). A spec whose template matches a warm pool (or `pool`, a pool's
        name) is claimed from it when it has a member started; else created cold, `info.pool` saying why.
        `max_per_owner`: the caller's own cap on `owner`'s live sandboxes (an owner key's), with the server's."""
        started = time.monotonic()
        if _pool_member is None:
            check_caller_owner(owner)
        spec = validated_spec(spec)
        self.backend.capabilities.check(spec, self.backend.name)
        self.limits.check(spec)
        pooled = _pool_member
        if _pool_member is None and not self._closing:
            claimed, pooled = await self.pools.claim(spec, owner=owner, pool_name=pool, started=started,
                                                     idempotency_key=idempotency_key, max_per_owner=max_per_owner)
            if claimed is not None:
                return claimed
        while True:
            if self._closing:
                raise BackendError("the sandbox service is shutting down; create the sandbox after it restarts")
            sandbox_id, token, now = new_sandbox_id(), secrets.token_urlsafe(32), time.time()
            info = SandboxInfo(id=sandbox_id, state="creating", spec=spec, backend=self.backend.name, token=token,
                               owner=owner, created_at=now, expires_at=now + spec.timeout_s, last_heartbeat=now,
                               pool=pooled)
            record = SandboxRecord(info=info, service_id=self.me.id)
            # The record exists before the backend makes anything: reconcile treats a sandbox the backend
            # runs without a record as an orphan. It is inserted only under the caps.
            admitted = await self.admission.admit(record, idempotency_key=idempotency_key,
                                                  max_per_owner=max_per_owner)
            if admitted.outcome == "admitted":
                break
            existing = await self._created_with_key(str(admitted.sandbox_id), owner, str(idempotency_key))
            if existing is not None:
                return existing
            # That create failed or was interrupted, and its key was freed: this one takes the key.
        admitted_at = time.monotonic()
        in_flight = self.creating[sandbox_id] = CreateInFlight()
        made: BackendSandbox | None = None
        try:
            made = await self.backend.create(sandbox_id, spec, token, owner=owner)
            record.backend = made
            info.agent_url, info.state, info.last_heartbeat = made.agent_url, "ready", time.time()
            info.startup = startup_timings(made, started, admitted_at, time.monotonic())
            if not self.store.update_if_state(record, "creating"):  # deleted meanwhile (another instance)
                raise SandboxLost(f"sandbox {sandbox_id} was deleted while it was being created")
            return info.model_copy(deep=True)
        except BaseException as e:
            # Shielded: a cancelled caller must not leave a half-made sandbox behind.
            await asyncio.shield(self._undo_create(sandbox_id, made))
            if isinstance(e, Exception) and not isinstance(e, OrchardError):
                raise BackendError(f"the {self.backend.name} backend failed to create a sandbox: {e}") from e
            raise
        finally:
            self.creating.pop(sandbox_id, None)
            in_flight.ended.set()

    async def _created_with_key(self, sandbox_id: str, owner: str, key: str) -> SandboxInfo | None:
        """The sandbox an earlier create with idempotency key `key` made, once ready; None once the key no
        longer names it (that create failed, or was interrupted and settled, before anyone got its sandbox),
        so that this one may create in its place. A pool member whose claim is in flight (still `idle`) is
        waited for: it is handed out only with the claim's fresh token."""
        deadline = time.monotonic() + self.create_drain_timeout_s
        while True:
            if self.store.idempotency_target(owner, key) != sandbox_id:
                return None
            record = self.store.get(sandbox_id)
            if record is None:
                return None
            info = record.info
            claiming = info.pool is not None and info.pool.idle
            if info.state == "ready" and not claiming:
                return info
            if info.state not in ("creating", "ready"):
                raise SandboxLost(f"idempotency key {key!r} already created sandbox {sandbox_id}, which is gone: "
                                  f"{gone_message(info)}; use a new key for a new sandbox")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackendError(f"sandbox {sandbox_id} (idempotency key {key!r}) was not ready after "
                                   f"{self.create_drain_timeout_s:g} s; retry later, or delete it and create "
                                   "another with a new key")
            if claiming:
                await asyncio.sleep(min(0.02, remaining))
            else:
                await self._until_create_ends(sandbox_id, remaining)

    async def stats(self) -> CapsStats:
        """What counts against the caps now (see admission.py)."""
        return self.admission.stats()

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return self._require(sandbox_id).info

    async def list(self, *, owner: str | None = None,
                   labels: dict[str, str] | None = None) -> list[SandboxInfo]:
        """Sandboxes not deleted (lost ones included, so their owners see why), oldest first."""
        infos = [r.info for r in self.store.list(owner=owner, states=VISIBLE_STATES)
                 if r.info.pool is None or not r.info.pool.idle]  # unclaimed pool members are nobody's
        if labels:
            infos = [i for i in infos if all(i.spec.labels.get(k) == v for k, v in labels.items())]
        return infos

    async def wait_ready(self, sandbox_id: str, timeout: float = 60) -> SandboxInfo:
        deadline = time.monotonic() + timeout
        while True:
            info = self._require(sandbox_id).info
            if info.state == "ready":
                return info
            if info.state != "creating":
                raise SandboxLost(gone_message(info))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackendError(f"sandbox {sandbox_id} was not ready after {timeout:g} s; wait longer or "
                                   "delete it and create another")
            await self._until_create_ends(sandbox_id, remaining)

    async def heartbeat(self, sandbox_id: str) -> SandboxInfo:
        record = self._require(sandbox_id)
        if record.info.state not in ("creating", "ready"):
            raise SandboxLost(gone_message(record.info))
        record.info.last_heartbeat = time.time()
        self.store.save(record)
        return record.info

    async def delete(self, sandbox_id: str) -> None:
        """Delete the sandbox (all its processes and files). Deleting a deleted sandbox does nothing."""
        record = self._require(sandbox_id)
        deadline = time.monotonic() + self.create_drain_timeout_s
        while (sandbox_id in self.creating and not self.creating[sandbox_id].loop.is_closed()
               and time.monotonic() < deadline):  # let the create finish (or fail and clean up) first
            await self._until_create_ends(sandbox_id, deadline - time.monotonic())
            record = self._require(sandbox_id)
        if record.info.state != "deleted":
            await self.remove(sandbox_id, None)

    async def reap(self) -> list[str]:
        """One reaper pass (see upkeep.reap); returns the ids deleted for TTL or heartbeat."""
        return await upkeep.reap(self)

    async def reconcile(self) -> ReconcileReport:
        """Match the store against the backend (see upkeep.reconcile)."""
        return await upkeep.reconcile(self)

    # --- shared with upkeep ------------------------------------------------------------------------------

    async def remove(self, sandbox_id: str, reason: str | None, *, final_state: str = "deleted") -> None:
        """Delete the backend's sandbox and record why (`final_state` "deleted" or "lost"). One task per
        sandbox, so the reaper, a user and `stop` never race each other."""
        task = self.deleting.get(sandbox_id)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = asyncio.create_task(self._remove_now(sandbox_id, reason, final_state))
            self.deleting[sandbox_id] = task

            def forget_task(_: asyncio.Task) -> None:
                if self.deleting.get(sandbox_id) is task:
                    del self.deleting[sandbox_id]

            task.add_done_callback(forget_task)
        await asyncio.shield(task)

    # --- internals ---------------------------------------------------------------------------------------

    async def _until_create_ends(self, sandbox_id: str, timeout: float) -> None:
        in_flight = self.creating.get(sandbox_id)
        if in_flight is not None and in_flight.loop is asyncio.get_running_loop():
            try:  # wake up as soon as it ends
                await asyncio.wait_for(in_flight.ended.wait(), timeout)
            except TimeoutError:
                pass
        else:  # created by another instance sharing the store, or on another event loop: look again soon
            await asyncio.sleep(min(0.1, max(timeout, 0.0)))

    def _require(self, sandbox_id: str) -> SandboxRecord:
        record = self.store.get(sandbox_id)
        if record is None and self.store.quarantined(kind="sandbox", sandbox_id=sandbox_id):
            raise SandboxNotFound(f"sandbox {sandbox_id}'s stored record was unreadable and was quarantined (see "
                                  "the orchestrator's log); its sandbox is deleted; create a new sandbox")
        if record is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}: it was never created here or was deleted over "
                                  f"{self.finished_retention_s:g} s ago; check the id or list the sandboxes")
        return record

    async def _undo_create(self, sandbox_id: str, made: BackendSandbox | None) -> None:
        try:
            if made is None:  # the backend failed midway: find what it may have left by id
                made = next((b for b in await self.backend.list_live() if b.id == sandbox_id), None)
            if made is not None:
                await self.backend.delete(made)
        except Exception as e:
            # Keep a `deleting` record so that the reaper retries; it is never shown as ready.
            log.error("cleaning up failed sandbox %s failed (will retry): %s", sandbox_id, e)
            record = self.store.get(sandbox_id)
            if record is not None:
                self.store.free_idempotency_keys(sandbox_id)  # never handed out: a retry creates anew
                record.info.state, record.info.token = "deleting", None
                record.info.error, record.backend = f"its creation failed and cleanup failed: {e}", made
                self.store.save(record)
            return
        current = self.store.get(sandbox_id)
        if current is not None and current.info.state == "creating":  # else someone deleted it: keep that
            self.store.remove(sandbox_id)

    async def _remove_now(self, sandbox_id: str, reason: str | None, final_state: str) -> None:
        record = self.store.get(sandbox_id)
        if record is None or record.info.state == "deleted":
            return
        record.info.state, record.info.error = "deleting", reason
        self.store.save(record)
        try:
            if record.backend is not None:
                await self.backend.delete(record.backend)
            else:  # never finished creating: find it by id
                found = [made for made in await self.backend.list_live() if made.id == sandbox_id]
                # Not running (its create was killed midway): the backend removes what is left by id.
                for made in found or [BackendSandbox(id=sandbox_id, agent_url="")]:
                    await self.backend.delete(made)
        except Exception as e:
            # The record stays `deleting` with its reason; the reaper retries.
            raise BackendError(f"could not delete sandbox {sandbox_id}: {e}; the orchestrator will retry") from e
        record.info.state, record.info.token, record.finished_at = final_state, None, time.time()
        record.info.error = reason
        self.store.save(record)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            try:
                reaped = await self.reap()
                if reaped:
                    log.info("reaped sandboxes %s", reaped)
            except Exception:
                log.exception("the sandbox reaper failed; retrying in %g s", self.reap_interval_s)


def gone_message(info: SandboxInfo) -> str:
    if info.state == "lost":
        return f"sandbox {info.id} is {info.error or 'lost'}"
    why = f" ({info.error})" if info.error else ""
    return f"sandbox {info.id} was deleted{why}; create a new sandbox"
