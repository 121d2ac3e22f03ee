"""The orchestrator's hard caps (live sandboxes in all and per owner, create rate), idempotency keys, and
the start time by stage on every sandbox record. Real parts: the embedded service on the real local
backend, a real `orchard serve` for the HTTP side, a real TCP proxy that drops a connection mid-create,
and two store connections on one SQLite file for orchestrators sharing a store."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from orchard.core.errors import BackendError, CapacityExceeded, IdempotencyConflict, SandboxLost
from orchard.core.sandbox import STARTUP_STAGES, SandboxInfo, SandboxSpec
from orchard.sandbox.client import AsyncOrchard
from orchard.sandbox.server.admission import CreateCaps
from orchard.sandbox.server.app import create_app
from orchard.sandbox.server.models import AdmissionRules, SandboxRecord
from orchard.sandbox.server.service import ACTIVE_STATES, SandboxService
from orchard.sandbox.server.store import SandboxStore
from tests.running_server import live_sandbox_ids, running_server


@pytest.fixture
async def service_with(tmp_path: Path) -> AsyncIterator:
    """Makes started embedded services (real local backend) under `tmp_path`; stops them, deleting all."""
    made: list[SandboxService] = []

    async def make(**caps) -> SandboxService:
        service = SandboxService.embedded(tmp_path / "home", caps=CreateCaps(**caps), reap_interval_s=0.2)
        await service.start()
        made.append(service)
        return service

    yield make
    for service in made:
        await service.stop(delete_all=True)


def record(sandbox_id: str, owner: str = "") -> SandboxRecord:
    now = time.time()
    return SandboxRecord(service_id="test", info=SandboxInfo(
        id=sandbox_id, state="creating", spec=SandboxSpec(), backend="local", owner=owner, created_at=now,
        expires_at=now + 60, last_heartbeat=now))


def assert_stages_consistent(info: SandboxInfo) -> None:
    startup = info.startup
    assert startup is not None, f"sandbox {info.id} has no startup timings"
    assert startup.backend_create_ms is not None and startup.admission_wait_ms is not None
    assert startup.first_health_ms is not None  # the local backend times its agent's first health answer
    assert startup.pool_claim_ms is None        # not claimed from a pool
    assert 0 < startup.stages_ms() <= startup.total_ms


# --- caps ----------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_thirty_concurrent_creates_never_exceed_a_cap_of_five(service_with, tmp_path):
    service = await service_with(max_sandboxes=5, wait_s=120)
    peak_backend = peak_store = 0
    running = True

    async def sample() -> None:
        nonlocal peak_backend, peak_store
        while running:
            peak_backend = max(peak_backend, len(await service.backend.list_live()))
            peak_store = max(peak_store, (await service.stats()).live)
            await asyncio.sleep(0.01)

    async def cycle() -> SandboxInfo:
        info = await service.create(SandboxSpec())
        await service.delete(info.id)
        return info

    sampler = asyncio.create_task(sample())
    try:
        infos = await asyncio.gather(*(cycle() for _ in range(30)))
    finally:
        running = False
        await sampler
    assert len({i.id for i in infos}) == 30
    assert 0 < peak_backend <= 5 and 0 < peak_store <= 5
    assert any(i.startup.admission_wait_ms > 0 for i in infos)  # most had to wait for a place
    for info in infos:
        assert_stages_consistent(info)
    assert await service.backend.list_live() == []


async def test_over_the_cap_a_create_gets_a_clear_refusal_and_nothing_is_made(service_with):
    service = await service_with(max_sandboxes=1, wait_s=0)
    first = await service.create(SandboxSpec())
    with pytest.raises(CapacityExceeded) as refused:
        await service.create(SandboxSpec())
    message = str(refused.value)
    assert "cap of 1 live sandboxes (1 now" in message and "did not wait" in message
    assert "--max-sandboxes" in message and "Delete sandboxes" in message
    assert [b.id for b in await service.backend.list_live()] == [first.id]
    assert [i.id for i in await service.list()] == [first.id]


async def test_a_create_over_the_cap_waits_and_succeeds_once_one_is_deleted(service_with):
    service = await service_with(max_sandboxes=1, wait_s=60)
    first = await service.create(SandboxSpec())
    second = asyncio.create_task(service.create(SandboxSpec()))
    while (await service.stats()).waiting == 0:
        await asyncio.sleep(0.01)
    assert not second.done()
    await service.delete(first.id)
    info = await second
    assert info.state == "ready" and info.id != first.id
    assert info.startup.admission_wait_ms > 0
    assert_stages_consistent(info)


async def test_a_create_waiting_for_a_place_gives_up_when_the_service_stops(tmp_path):
    home = tmp_path / "home"
    service = SandboxService.embedded(home, caps=CreateCaps(max_sandboxes=1, wait_s=60))
    await service.start()
    await service.create(SandboxSpec())
    waiting = asyncio.create_task(service.create(SandboxSpec()))
    while (await service.stats()).waiting == 0:
        await asyncio.sleep(0.01)
    await service.stop(delete_all=True)
    with pytest.raises(BackendError, match="shutting down"):
        await waiting
    assert await live_sandbox_ids(home) == set()


async def test_the_per_owner_cap_counts_each_owner_apart(service_with):
    service = await service_with(max_sandboxes_per_owner=1, wait_s=0)
    await service.create(SandboxSpec(), owner="alice")
    with pytest.raises(CapacityExceeded, match="owner 'alice' is at its cap of 1 live sandboxes"):
        await service.create(SandboxSpec(), owner="alice")
    await service.create(SandboxSpec(), owner="bob")
    assert (await service.stats()).by_owner == {"alice": 1, "bob": 1}


def test_the_create_rate_is_a_token_bucket_shared_through_the_store(tmp_path):
    """Store level with explicit clock values: the bucket's arithmetic, without sleeping."""
    store = SandboxStore(tmp_path / "state.db")
    try:
        rules = AdmissionRules(live_states=ACTIVE_STATES, rate_per_s=2.0, rate_burst=2)
        t = 1000.0
        assert [store.admit(record(f"sb-{i}"), rules, t).outcome for i in range(3)] == ["admitted", "admitted",
                                                                                        "full"]
        refused = store.admit(record("sb-3"), rules, t + 0.25)
        assert refused.cap == "rate" and refused.retry_after_s == pytest.approx(0.25)
        assert store.admit(record("sb-4"), rules, t + 0.5).outcome == "admitted"  # one token back after 0.5 s
        assert store.admit(record("sb-5"), rules, t + 10).outcome == "admitted"   # refilled, up to the burst
        assert store.admit(record("sb-6"), rules, t + 10).outcome == "admitted"
        assert store.admit(record("sb-7"), rules, t + 10).outcome == "full"
    finally:
        store.close()


async def test_a_create_over_the_rate_waits_for_its_turn_or_is_refused(service_with):
    service = await service_with(max_creates_per_s=0.05, create_burst=1, wait_s=0)
    await service.create(SandboxSpec())
    with pytest.raises(CapacityExceeded, match=r"creates are limited to 0.05 a second .*retry in \d+"):
        await service.create(SandboxSpec())
    service.admission.caps = CreateCaps(max_creates_per_s=2.0, create_burst=1, wait_s=30)
    await asyncio.sleep(0.5)  # the bucket holds one token again
    infos = await asyncio.gather(*(service.create(SandboxSpec()) for _ in range(3)))
    waits = sorted(info.startup.admission_wait_ms for info in infos)
    # Admitted one at a time, 0.5 s apart: the third waited for two tokens to come back (a lower bound).
    assert waits[2] >= 900 and waits[1] >= 400


async def test_a_rate_refusal_over_http_says_when_to_retry(service_with):
    """The REST app in process (httpx's ASGI transport) on a started service: 429 with Retry-After."""
    service = await service_with(max_creates_per_s=0.05, create_burst=1, wait_s=0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(service, "key")),
                                 base_url="http://orchard", headers={"Authorization": "Bearer key"}) as http:
        assert (await http.post("/v1/sandboxes", json={})).status_code == 201
        refused = await http.post("/v1/sandboxes", json={})
    assert refused.status_code == 429 and refused.json()["error"] == "capacity_exceeded"
    assert 1 <= int(refused.headers["Retry-After"]) <= 20


def test_orchestrators_sharing_a_store_never_admit_past_the_cap(tmp_path):
    """Two connections on one SQLite file (two orchestrators sharing a home), each admitting from several
    threads at once: exactly the cap gets in."""
    path = tmp_path / "state.db"
    stores = [SandboxStore(path), SandboxStore(path)]
    rules = AdmissionRules(live_states=ACTIVE_STATES, max_sandboxes=7)
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def admit_many(store: SandboxStore, worker: int) -> None:
        start.wait()
        for i in range(10):
            outcomes.append(store.admit(record(f"sb-{worker}-{i}"), rules, time.time()).outcome)

    threads = [threading.Thread(target=admit_many, args=(stores[w % 2], w)) for w in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count("admitted") == 7 and outcomes.count("full") == 73
        assert stores[0].count(states=ACTIVE_STATES) == 7
    finally:
        for store in stores:
            store.close()


async def test_two_orchestrators_on_one_home_share_the_cap(service_with):
    """Two services on one state database (replicas): creates on both at once stay under the one cap, and
    one's sandboxes hold the other's creates back."""
    first, second = await service_with(max_sandboxes=2, wait_s=0), await service_with(max_sandboxes=2, wait_s=0)
    results = await asyncio.gather(*(service.create(SandboxSpec()) for service in (first, second) * 3),
                                   return_exceptions=True)
    made = [r for r in results if isinstance(r, SandboxInfo)]
    assert len(made) == 2 and all(isinstance(r, CapacityExceeded) for r in results if r not in made)
    assert len(await first.backend.list_live()) == 2
    assert (await first.stats()).live == (await second.stats()).live == 2


# --- idempotency keys ----------------------------------------------------------------------------------


async def test_the_same_idempotency_key_returns_one_sandbox(service_with):
    service = await service_with()
    infos = await asyncio.gather(*(service.create(SandboxSpec(), owner="alice", idempotency_key="k1")
                                   for _ in range(3)))
    again = await service.create(SandboxSpec(), owner="alice", idempotency_key="k1")
    assert {i.id for i in infos} == {again.id} and again.state == "ready" and again.token == infos[0].token
    assert [b.id for b in await service.backend.list_live()] == [again.id]
    other_owner = await service.create(SandboxSpec(), owner="bob", idempotency_key="k1")  # keys are per owner
    assert other_owner.id != again.id


async def test_a_key_reused_with_another_spec_is_refused_and_a_deleted_ones_key_says_so(service_with):
    service = await service_with()
    info = await service.create(SandboxSpec(), idempotency_key="k2")
    with pytest.raises(IdempotencyConflict, match=f"already used by this owner to create sandbox {info.id}"):
        await service.create(SandboxSpec(env={"OTHER": "1"}), idempotency_key="k2")
    await service.delete(info.id)
    with pytest.raises(SandboxLost, match="use a new key"):
        await service.create(SandboxSpec(), idempotency_key="k2")
    service.store.purge_finished(time.time() + 1)  # the record expires, and its key with it
    assert (await service.create(SandboxSpec(), idempotency_key="k2")).id != info.id


class DropFirstAnswer:
    """A TCP proxy in front of the server that forwards requests but cuts the first connection the moment
    the server starts answering: the create happened, the client never hears of it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.dropped = 0
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        drop = self.dropped == 0
        self.dropped += drop

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, cut: bool) -> None:
            try:
                while data := await src.read(65536):
                    if cut:
                        break
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, drop),
                                 return_exceptions=True)
        finally:
            writer.close()
            up_writer.close()


def test_over_http_caps_are_429_keys_are_409_and_a_dropped_create_is_retried_into_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHARD_MAX_SANDBOXES_PER_OWNER", "2")
    monkeypatch.setenv("ORCHARD_CREATE_WAIT_S", "0")
    home = tmp_path / "home"
    home.mkdir()

    async def scenario(url: str, api_key: str) -> set[str]:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {api_key}"},
                                     timeout=60) as http:
            first = await http.post("/v1/sandboxes", json={}, headers={"Idempotency-Key": "a"})
            assert first.status_code == 201 and first.json()["startup"]["total_ms"] > 0
            again = await http.post("/v1/sandboxes", json={}, headers={"Idempotency-Key": "a"})
            assert again.json()["id"] == first.json()["id"]
            conflict = await http.post("/v1/sandboxes", json={"env": {"X": "1"}}, headers={"Idempotency-Key": "a"})
            assert conflict.status_code == 409 and conflict.json()["error"] == "idempotency_conflict"

            proxy = DropFirstAnswer(int(url.rsplit(":", 1)[1]))
            async with proxy as proxy_url, AsyncOrchard(proxy_url, api_key) as orch:
                sandbox = await orch.create(detach=True)  # its first answer is cut: the SDK sends it again
            assert proxy.dropped == 1 and sandbox.startup is not None
            stats = (await http.get("/v1/stats")).json()
            assert stats["by_owner"] == {"default": 2} and stats["caps"]["max_sandboxes_per_owner"] == 2

            over = await http.post("/v1/sandboxes", json={})
            assert over.status_code == 429 and over.json()["error"] == "capacity_exceeded"
            assert "owner 'default' is at its cap of 2 live sandboxes (2 now)" in over.json()["message"]
            return {first.json()["id"], sandbox.id}

    with running_server(home, api_key="caps-key") as server:
        made = asyncio.run(scenario(server.url, server.api_key))
        assert asyncio.run(live_sandbox_ids(home)) == made


async def test_the_sdk_passes_its_key_and_embedded_caps(tmp_path):
    async with AsyncOrchard(home=tmp_path / "home", caps={"max_sandboxes": 1, "wait_s": 0}) as orch:
        key = uuid.uuid4().hex
        sandbox = await orch.create(idempotency_key=key)
        assert (await orch.create(idempotency_key=key)).id == sandbox.id
        assert sandbox.startup is not None and sandbox.startup.total_ms >= sandbox.startup.stages_ms()
        with pytest.raises(CapacityExceeded):
            await orch.create()
    assert set(STARTUP_STAGES) < set(type(sandbox.startup).model_fields)
