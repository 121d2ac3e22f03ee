"""The orchestrator end to end: its REST API served by a real uvicorn (`serve()` in a subprocess) on the
real local backend, talked to with httpx; sandboxes' agents reached over their Unix sockets. Also the
in-process service the embedded SDK uses.

Every sandbox a test makes carries a unique environment variable (`ORCHARD_TEST_MARK`), so "no process
left" is checked by looking for the processes of the sandboxes that carry it: those whose environment holds
it, and those in the cgroups of the sandboxes whose spec holds it (an agent the zygote forked shows the
sandbox's environment in /proc only where it fits the room the zygote keeps for it)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.registry import backend_config, create_backend
from orchard.sandbox.server.home import state_db_path
from orchard.sandbox.server.service import SandboxService
from orchard.sandbox.server.store import SandboxStore
from tests.running_server import environments, free_port, stop_process, wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent
API_KEY = "orchestrator-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MARK = "ORCHARD_TEST_MARK"
REAP_INTERVAL_S = 0.2

SERVE = "import json, sys; from orchard.sandbox.server.main import serve; serve(**json.loads(sys.argv[1]))"


# --- helpers -------------------------------------------------------------------------------------------


class ServerProcess:
    """`serve()` in its own process, so that it can be killed like a crashing orchestrator."""

    def __init__(self, home: Path) -> None:
        self.home = home
        HOMES.add(home)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = home / f"serve-{uuid.uuid4().hex[:6]}.log"
        options = {"host": "127.0.0.1", "port": int(self.url.rsplit(":", 1)[1]), "backend": "local",
                   "api_key": API_KEY, "home": str(home), "reap_interval_s": REAP_INTERVAL_S,
                   "log_level": "info"}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-c", SERVE, json.dumps(options)], cwd=REPO_ROOT,
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the server exited early:\n{self.log.read_text()}"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.kill()
        raise AssertionError(f"the server did not come up:\n{self.log.read_text()}")

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=120, **kwargs)

    def stop(self) -> None:
        """Graceful (SIGTERM): the service stops, its sandboxes keep running."""
        stop_process(self.process)

    def kill(self) -> None:
        """A crash: nothing of the service's shutdown runs."""
        self.process.kill()
        self.process.wait()


def sweep(home: Path) -> None:
    """Delete every sandbox under `home`: a fresh service takes over what stopped instances left, then
    deletes it all. Then check the backend runs nothing there."""
    async def run() -> list[str]:
        backend = create_backend(backend_config("local", home))
        service = SandboxService(backend, SandboxStore(state_db_path(home)))
        await service.start()
        await service.stop(delete_all=True)
        return [b.id for b in await create_backend(backend_config("local", home)).list_live()]

    assert asyncio.run(run()) == []


HOMES: set[Path] = set()  # the Orchard homes this module's sandboxes were made in
MARKED_KEYS: dict[str, set[str]] = {}  # mark -> the cgroup keys of the sandboxes whose spec carried it


def remember_marked_sandboxes() -> None:
    """Note the cgroup key of every sandbox in HOMES' stores under the mark its spec carries (kept after
    its row goes: a test makes an orphan by deleting one)."""
    for home in HOMES:
        db = state_db_path(home)
        if not db.exists():
            continue
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            rows = connection.execute("SELECT id, record FROM sandboxes").fetchall()
        backend = create_backend(backend_config("local", home))
        for sandbox_id, record in rows:
            value = json.loads(record)["info"]["spec"]["env"].get(MARK)
            if value is not None:
                MARKED_KEYS.setdefault(value, set()).add(backend._key(sandbox_id))


def sandbox_key_of(cgroup_line: str) -> str | None:
    """The sandbox key of a `/proc/PID/cgroup` line: the group right under an `orchard` group."""
    parts = cgroup_line.split(":", 2)[-1].split("/")
    return next((child for parent, child in zip(parts, parts[1:]) if parent == "orchard"), None)


def marked_pids(mark: str) -> list[int]:
    """The processes of the sandboxes marked `mark`: those whose environment holds
    `ORCHARD_TEST_MARK=<mark>`, and those in the cgroups of a sandbox whose spec holds it."""
    remember_marked_sandboxes()
    keys = MARKED_KEYS.get(mark, set())
    needle = f"{MARK}={mark}".encode()
    pids = []
    for pid, environ in environments():
        try:
            groups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if needle in environ or any(sandbox_key_of(line) in keys for line in groups.splitlines()):
            pids.append(pid)
    return pids


def agent(info: dict) -> httpx.Client:
    """A client of the sandbox's agent, over its Unix socket, with its token."""
    assert info["agent_url"].startswith("unix://")
    return httpx.Client(transport=httpx.HTTPTransport(uds=info["agent_url"].removeprefix("unix://")),
                        base_url="http://agent", headers={"Authorization": f"Bearer {info['token']}"}, timeout=30)


def agent_reachable(info: dict) -> bool:
    try:
        with agent(info) as a:
            a.get("/health")
        return True
    except httpx.TransportError:
        return False


def exec_in(info: dict, command: str) -> dict:
    with agent(info) as a:
        response = a.post("/exec", json={"command": command})
    assert response.status_code == 200, response.text
    return response.json()


def db_ids(home: Path) -> set[str]:
    with sqlite3.connect(f"file:{state_db_path(home)}?mode=ro", uri=True) as db:
        return {row[0] for row in db.execute("SELECT id FROM sandboxes")}


def assert_error(response: httpx.Response, status: int, code: str, *fragments: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message"} and body["error"] == code, body
    for fragment in fragments:
        assert fragment in body["message"], body
    return body["message"]


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("orch")
    running = ServerProcess(home)
    try:
        yield running
    finally:
        running.stop()
        sweep(home)


@pytest.fixture
def api(server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def mark(tmp_path) -> Iterator[str]:
    """A marker for this test's sandboxes (made in the server's home or in tmp_path); at the end none of
    their processes may be left."""
    HOMES.add(tmp_path)
    value = uuid.uuid4().hex
    yield value
    assert wait_for(lambda: not marked_pids(value), 10, "the test's sandbox processes to be gone") is True


def spec(mark: str, **fields: Any) -> dict:
    return {"env": {MARK: mark}, "timeout_s": 600, **fields}


# --- REST: basics --------------------------------------------------------------------------------------


def test_healthz_and_openapi_are_served_without_a_key(server):
    health = httpx.get(f"{server.url}/healthz")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["backend"] == "local"
    openapi = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/sandboxes", "/v1/sandboxes/{sandbox_id}", "/v1/sandboxes/{sandbox_id}/wait",
            "/v1/sandboxes/{sandbox_id}/heartbeat", "/healthz"} <= set(openapi["paths"])
    assert openapi["paths"]["/v1/sandboxes"]["post"]["responses"]["201"]
    assert any(s.get("scheme") == "bearer" for s in openapi["components"]["securitySchemes"].values())
    assert httpx.get(f"{server.url}/docs").status_code == 200


def test_requests_without_or_with_a_wrong_key_are_401(server):
    before = db_ids(server.home)
    missing = httpx.get(f"{server.url}/v1/sandboxes")
    assert_error(missing, 401, "unauthorized", "Authorization: Bearer")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = {"Authorization": "Bearer not-the-key"}
    assert_error(httpx.get(f"{server.url}/v1/sandboxes", headers=wrong), 401, "unauthorized", "wrong API key")
    assert_error(httpx.post(f"{server.url}/v1/sandboxes", headers=wrong, json={}), 401, "unauthorized")
    assert_error(httpx.post(f"{server.url}/v1/sandboxes", headers={"Authorization": API_KEY}, json={}),
                 401, "unauthorized")
    assert db_ids(server.home) == before


def test_unknown_sandbox_is_404_naming_it(api):
    for method, path in [("GET", ""), ("DELETE", ""), ("POST", "/heartbeat"), ("POST", "/wait")]:
        response = api.request(method, f"/v1/sandboxes/sb-000000000000{path}")
        assert_error(response, 404, "sandbox_not_found", "sb-000000000000")
    assert_error(api.get("/v1/no-such-route"), 404, "not_found", "/v1/no-such-route")


# --- REST: lifecycle -----------------------------------------------------------------------------------


def test_create_get_list_heartbeat_wait_delete(server, api, mark):
    created = api.post("/v1/sandboxes", json=spec(mark, labels={"suite": mark}))
    assert created.status_code == 201, created.text
    info = created.json()
    assert info["state"] == "ready" and info["id"].startswith("sb-") and len(info["id"]) == 15
    assert info["owner"] == "default" and info["backend"] == "local" and len(info["token"]) >= 40
    assert info["expires_at"] == pytest.approx(info["created_at"] + 600)
    assert exec_in(info, "echo hi")["stdout"] == "hi\n"
    assert marked_pids(mark)

    assert api.get(f"/v1/sandboxes/{info['id']}").json() == info
    other = api.post("/v1/sandboxes", params={"owner": "alice"}, json=spec(mark, labels={"suite": mark}))
    assert other.status_code == 201 and other.json()["owner"] == "alice"
    listed = api.get("/v1/sandboxes", params={"label": f"suite={mark}"}).json()["sandboxes"]
    assert [s["id"] for s in listed] == [info["id"], other.json()["id"]]
    by_alice = api.get("/v1/sandboxes", params=[("label", f"suite={mark}"), ("owner", "alice")]).json()
    assert [s["id"] for s in by_alice["sandboxes"]] == [other.json()["id"]]
    assert api.get("/v1/sandboxes", params={"label": "suite=nothing-has-this"}).json() == {"sandboxes": []}
    assert_error(api.get("/v1/sandboxes", params={"label": "no-equals-sign"}), 400, "invalid_request", "KEY=VALUE")

    beat = api.post(f"/v1/sandboxes/{info['id']}/heartbeat")
    assert beat.status_code == 200 and beat.json()["last_heartbeat"] > info["last_heartbeat"]
    assert api.post(f"/v1/sandboxes/{info['id']}/wait", params={"timeout": 5}).json()["state"] == "ready"
    assert_error(api.post(f"/v1/sandboxes/{info['id']}/wait", params={"timeout": -1}), 400, "invalid_request",
                 "timeout")

    for sandbox in (info, other.json()):
        deleted = api.delete(f"/v1/sandboxes/{sandbox['id']}")
        assert deleted.status_code == 204 and deleted.content == b""
    after = api.get(f"/v1/sandboxes/{info['id']}").json()
    assert after["state"] == "deleted" and after["token"] is None
    assert not agent_reachable(info)
    assert not marked_pids(mark)
    assert api.get("/v1/sandboxes", params={"label": f"suite={mark}"}).json() == {"sandboxes": []}
    assert api.delete(f"/v1/sandboxes/{info['id']}").status_code == 204  # again: nothing to do
    assert_error(api.post(f"/v1/sandboxes/{info['id']}/heartbeat"), 410, "sandbox_lost", "deleted")
    assert_error(api.post(f"/v1/sandboxes/{info['id']}/wait"), 410, "sandbox_lost", "deleted")


@pytest.mark.parametrize("body, fragment", [
    ({"timeout_s": -5}, "timeout_s"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"image": "/no/such/rootfs-dir"}, "/no/such/rootfs-dir"),          # refused by the backend
    ({"env": {"A=B": "x"}}, "A=B"),                                      # refused by the backend
    ({"network": {"mode": "open", "allow": ["example.com"]}}, "network"),
], ids=["negative-timeout", "unknown-field", "missing-rootfs", "bad-env-name", "bad-network"])
def test_an_invalid_spec_is_400_and_creates_nothing(server, api, mark, body, fragment):
    rows, dirs = db_ids(server.home), set((server.home / "sandboxes").iterdir())
    response = api.post("/v1/sandboxes", json={**spec(mark), **body})
    assert_error(response, 400, "invalid_request", fragment)
    assert db_ids(server.home) == rows
    assert set((server.home / "sandboxes").iterdir()) == dirs
    assert not marked_pids(mark)


def test_a_body_that_is_not_json_is_400(api):
    response = api.post("/v1/sandboxes", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_request", "JSON")


def test_an_oversized_body_is_413_declared_or_chunked(server, api):
    rows = db_ids(server.home)
    big = json.dumps({"env": {"X": "y" * (2 * 1024 * 1024)}}).encode()
    declared = api.post("/v1/sandboxes", content=big, headers={"Content-Type": "application/json"})
    assert_error(declared, 413, "too_large", "limit")

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 256 * 1024):
            yield big[i:i + 256 * 1024]

    chunked = api.post("/v1/sandboxes", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(chunked, 413, "too_large", "limit")
    assert db_ids(server.home) == rows


# --- reaping -------------------------------------------------------------------------------------------


def test_a_sandbox_past_its_ttl_is_deleted(api, mark):
    info = api.post("/v1/sandboxes", json=spec(mark, timeout_s=1)).json()
    assert info["state"] == "ready"
    gone = wait_for(lambda: (s := api.get(f"/v1/sandboxes/{info['id']}").json())["state"] == "deleted" and s,
                    10, "the TTL reaper")
    assert "TTL" in gone["error"]
    assert not agent_reachable(info)


def test_a_sandbox_without_heartbeats_is_deleted(api, mark):
    info = api.post("/v1/sandboxes", json=spec(mark, heartbeat_timeout_s=1)).json()
    until = time.monotonic() + 2.5  # heartbeats keep it alive well past its heartbeat timeout...
    while time.monotonic() < until:
        assert api.post(f"/v1/sandboxes/{info['id']}/heartbeat").status_code == 200
        time.sleep(0.3)
    assert exec_in(info, "true")["exit_code"] == 0
    # ...and without them it goes.
    gone = wait_for(lambda: (s := api.get(f"/v1/sandboxes/{info['id']}").json())["state"] == "deleted" and s,
                    10, "the heartbeat reaper")
    assert "heartbeat" in gone["error"]
    assert not agent_reachable(info)


def test_a_sandbox_whose_processes_die_is_marked_lost(api, mark):
    info = api.post("/v1/sandboxes", json=spec(mark)).json()
    for pid in marked_pids(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # gone with one killed before it (its pid namespace's init)
            pass
    lost = wait_for(lambda: (s := api.get(f"/v1/sandboxes/{info['id']}").json())["state"] == "lost" and s,
                    10, "the reaper to notice the dead sandbox")
    assert "lost" in lost["error"] and lost["token"] is None
    assert info["id"] in [s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]]
    assert_error(api.post(f"/v1/sandboxes/{info['id']}/heartbeat"), 410, "sandbox_lost", "lost")
    assert api.delete(f"/v1/sandboxes/{info['id']}").status_code == 204
    assert api.get(f"/v1/sandboxes/{info['id']}").json()["state"] == "deleted"


# --- concurrency ---------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_fifty_creates_at_once(server, mark):
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=240) as client:
        created = await asyncio.gather(*(client.post("/v1/sandboxes", json=spec(mark, labels={"batch": mark}))
                                         for _ in range(50)))
        assert [r.status_code for r in created] == [201] * 50, [r.text for r in created if r.status_code != 201]
        infos = [r.json() for r in created]
        assert len({i["id"] for i in infos}) == 50 and len({i["agent_url"] for i in infos}) == 50
        assert all(i["state"] == "ready" for i in infos)
        listed = (await client.get("/v1/sandboxes", params={"label": f"batch={mark}"})).json()["sandboxes"]
        assert {s["id"] for s in listed} == {i["id"] for i in infos}
        for info in infos[:: 10]:
            assert (await asyncio.to_thread(exec_in, info, f"echo {info['id']}"))["stdout"] == f"{info['id']}\n"
        deleted = await asyncio.gather(*(client.delete(f"/v1/sandboxes/{i['id']}") for i in infos))
        assert [r.status_code for r in deleted] == [204] * 50


# --- restart -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_restarted_orchestrator_readopts_live_sandboxes_and_removes_the_rest(tmp_path):
    marks = {name: uuid.uuid4().hex for name in ("kept", "expiring", "orphan", "dead")}
    first = ServerProcess(tmp_path)
    try:
        with first.client() as api:
            made = {name: api.post("/v1/sandboxes", json=spec(m, timeout_s=4 if name == "expiring" else 600))
                    for name, m in marks.items()}
        assert all(r.status_code == 201 for r in made.values()), {n: r.text for n, r in made.items()}
        infos = {name: r.json() for name, r in made.items()}
        assert all(marked_pids(m) for m in marks.values())
    finally:
        first.kill()  # a crash: the service never stops, its sandboxes keep running

    try:
        with sqlite3.connect(state_db_path(tmp_path)) as db:  # the store forgets one: an orphan
            db.execute("DELETE FROM sandboxes WHERE id = ?", (infos["orphan"]["id"],))
        for pid in marked_pids(marks["dead"]):  # one dies while nobody watches
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # gone with one killed before it (its pid namespace's init)
                pass
        time.sleep(max(0.0, infos["expiring"]["expires_at"] - time.time() + 0.2))  # one's TTL passes
        assert marked_pids(marks["kept"]) and marked_pids(marks["expiring"]) and marked_pids(marks["orphan"])

        second = ServerProcess(tmp_path)
        try:
            with second.client() as api:
                kept = api.get(f"/v1/sandboxes/{infos['kept']['id']}").json()
                assert kept["state"] == "ready" and kept["token"] == infos["kept"]["token"]
                assert exec_in(kept, "echo still here")["stdout"] == "still here\n"
                assert api.post(f"/v1/sandboxes/{kept['id']}/heartbeat").status_code == 200

                expired = api.get(f"/v1/sandboxes/{infos['expiring']['id']}").json()
                assert expired["state"] == "deleted" and "TTL" in expired["error"]
                assert not marked_pids(marks["expiring"]) and not agent_reachable(infos["expiring"])

                assert_error(api.get(f"/v1/sandboxes/{infos['orphan']['id']}"), 404, "sandbox_not_found")
                assert not marked_pids(marks["orphan"]) and not agent_reachable(infos["orphan"])
                assert not (tmp_path / "sandboxes" / infos["orphan"]["id"]).exists()

                dead = api.get(f"/v1/sandboxes/{infos['dead']['id']}").json()
                assert dead["state"] == "lost" and "restarted" in dead["error"]

                listed = {s["id"]: s["state"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}
                assert listed == {infos["kept"]["id"]: "ready", infos["dead"]["id"]: "lost"}
                assert api.delete(f"/v1/sandboxes/{kept['id']}").status_code == 204
                assert not marked_pids(marks["kept"])
            assert "adopted" in second.log.read_text()
        finally:
            second.stop()
    finally:
        sweep(tmp_path)
        assert not any(marked_pids(m) for m in marks.values())


# --- the in-process service (embedded SDK) -------------------------------------------------------------


async def test_embedded_service_stop_delete_all_removes_everything(tmp_path, monkeypatch, mark):
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path))
    service = SandboxService.embedded()
    await service.start()
    made = await asyncio.gather(*(service.create(SandboxSpec(env={MARK: mark})) for _ in range(3)))
    assert all(i.state == "ready" for i in made) and len(marked_pids(mark)) >= 3
    assert (await service.wait_ready(made[0].id)).id == made[0].id
    await service.stop(delete_all=True)
    assert not marked_pids(mark)

    again = SandboxService.embedded()  # the records say what happened
    report = await again.start()
    try:
        assert report.adopted == [] and report.orphans_removed == []
        assert {(await again.get(i.id)).state for i in made} == {"deleted"}
        assert await again.list() == []
    finally:
        await again.stop(delete_all=True)


async def test_sandboxes_of_a_killed_embedded_process_are_removed_not_adopted(tmp_path, mark):
    script = textwrap.dedent(f"""
        import asyncio, sys
        from orchard.core.sandbox import SandboxSpec
        from orchard.sandbox.server.service import SandboxService

        async def main():
            service = SandboxService.embedded(sys.argv[1])
            await service.start()
            info = await service.create(SandboxSpec(env={{"{MARK}": sys.argv[2]}}))
            print(info.id, flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
    """)
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), mark], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        sandbox_id = process.stdout.readline().strip()
        assert sandbox_id.startswith("sb-") and marked_pids(mark)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
    assert marked_pids(mark)  # the sandbox outlived the process...

    service = SandboxService.embedded(tmp_path)
    report = await service.start()  # ...and the next embedded start removes it
    try:
        assert report.orphans_removed == [sandbox_id] and report.adopted == []
        assert not marked_pids(mark)
        assert (await service.get(sandbox_id)).state == "deleted"
    finally:
        await service.stop(delete_all=True)


async def test_instances_sharing_a_home_leave_each_other_alone(tmp_path, mark):
    first, second = SandboxService.embedded(tmp_path), SandboxService.embedded(tmp_path)
    await first.start()
    try:
        mine = await first.create(SandboxSpec(env={MARK: mark}))
        report = await second.start()
        assert mine.id not in report.orphans_removed + report.adopted + report.lost
        assert [i.id for i in await second.list()] == [mine.id]  # visible to both...
        await second.reap()
        await second.stop(delete_all=True)  # ...but only its creator deletes it
        assert (await first.get(mine.id)).state == "ready" and marked_pids(mark)
    finally:
        await first.stop(delete_all=True)
    assert not marked_pids(mark)
