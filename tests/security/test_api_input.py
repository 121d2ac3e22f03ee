"""Attacks on the orchestrator's input, performed against a real `orchard serve` on the real local backend:
non-finite numbers (one used to make every later read of the store fail, a restart included), rows of the
store that cannot be read back, reserved environment variables, over-long strings and the host's root as
an image. Each must now be refused with a 400 naming what is wrong, or survived."""

from __future__ import annotations

import contextlib
import secrets
import uuid
from pathlib import Path

import httpx
import pytest

from orchard.core.errors import AuthError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from tests.security.serve_process import (MARK, Serve, assert_refused, db, leftovers, local_backend,
                                          marked_pids, remove_everything, wait_for)


@pytest.fixture(scope="module")
def serve_options() -> dict:
    """No maximum TTL: only the spec's own checks (`home`, `server` and `api` are conftest.py's)."""
    return {"env": {"ORCHARD_MAX_TIMEOUT_S": "none"}}


def post_raw(api: httpx.Client, body: str) -> httpx.Response:
    """JSON as written, since Python's json module cannot write 1e999."""
    return api.post("/v1/sandboxes", content=body, headers={"Content-Type": "application/json"})


# --- non-finite numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize("body, field", [
    ('{"image": "host", "timeout_s": 1e999}', "timeout_s"),
    ('{"image": "host", "timeout_s": Infinity}', "timeout_s"),
    ('{"image": "host", "heartbeat_timeout_s": 1e999}', "heartbeat_timeout_s"),
    ('{"image": "host", "cpu": NaN}', "cpu"),
    ('{"image": "host", "cpu": -Infinity}', "cpu"),
])
def test_non_finite_numbers_are_refused_and_the_server_keeps_serving(api, body, field):
    assert_refused(post_raw(api, body), field, "finite")
    listed = api.get("/v1/sandboxes")
    assert listed.status_code == 200, listed.text


def test_wait_timeout_must_be_finite(api):
    response = api.post("/v1/sandboxes/sb-000000000000/wait", params={"timeout": "inf"})
    assert response.status_code == 400, response.text


# --- a corrupt row in the store ------------------------------------------------------------------------


def corrupt(home: Path, sandbox_id: str) -> None:
    """What the infinite TTL used to leave: the row's timeout_s stored as JSON null."""
    with contextlib.closing(db(home)) as conn:
        changed = conn.execute(
            "UPDATE sandboxes SET record = json_set(record, '$.info.spec.timeout_s', json('null')) WHERE id = ?",
            (sandbox_id,)).rowcount
    assert changed == 1


def quarantined(home: Path) -> dict[str, int]:
    with contextlib.closing(db(home)) as conn:
        return dict(conn.execute("SELECT id, cleaned_up FROM quarantine").fetchall())


def test_a_corrupt_row_does_not_stop_listing_the_reaper_or_a_restart(tmp_path):
    mark = uuid.uuid4().hex
    server = Serve(tmp_path).wait_up()
    try:
        with server.client() as api:
            made = {}
            for name in ("victim", "bystander"):
                response = api.post("/v1/sandboxes", json={"env": {MARK: mark}, "labels": {"name": name}})
                assert response.status_code == 201, response.text
                made[name] = response.json()
            victim, bystander = made["victim"], made["bystander"]
            corrupt(tmp_path, victim["id"])

            # Listing skips the bad row (and quarantines it); the rest is served.
            listed = api.get("/v1/sandboxes")
            assert listed.status_code == 200, listed.text
            assert [s["id"] for s in listed.json()["sandboxes"]] == [bystander["id"]]
            gone = api.get(f"/v1/sandboxes/{victim['id']}")
            assert gone.status_code == 404 and "quarantined" in gone.json()["message"], gone.text
            assert api.post(f"/v1/sandboxes/{bystander['id']}/heartbeat").status_code == 200
            assert victim["id"] in quarantined(tmp_path)

            # The reaper goes on: it deletes the quarantined row's sandbox (nothing could enforce its
            # TTL any more) and still enforces the TTL of the others.
            wait_for(lambda: quarantined(tmp_path)[victim["id"]] == 1, 60, "the victim's sandbox to be deleted")
            assert leftovers(tmp_path, {victim["id"]}) == []
            short = api.post("/v1/sandboxes", json={"env": {MARK: mark}, "timeout_s": 1})
            assert short.status_code == 201, short.text
            wait_for(lambda: api.get(f"/v1/sandboxes/{short.json()['id']}").json()["state"] == "deleted", 60,
                     "the reaper to delete a sandbox past its TTL")

        # A restart with a corrupt row (here: not even JSON) in the store comes up and serves.
        server.stop()
        with contextlib.closing(db(tmp_path)) as conn:
            conn.execute("UPDATE sandboxes SET record = '{not json' WHERE id = ?", (bystander["id"],))
        server = Serve(tmp_path).wait_up()
        with server.client() as api:
            listed = api.get("/v1/sandboxes")
            assert listed.status_code == 200, listed.text
            assert listed.json()["sandboxes"] == []
            assert api.post("/v1/sandboxes", json={"env": {MARK: mark}}).status_code == 201
        # The sandbox of the row that became unreadable while the server was down is not left running.
        wait_for(lambda: quarantined(tmp_path).get(bystander["id"]) == 1, 60, "the bystander's cleanup")
        assert leftovers(tmp_path, {bystander["id"]}) == []
    finally:
        server.stop()
        remove_everything(tmp_path)  # whatever still runs under this home
    wait_for(lambda: not marked_pids(mark), 10, "the test's sandbox processes to be gone")


# --- reserved environment variables --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ORCHARD_AGENT_TOKEN_FILE", "ORCHARD_AGENT_TOKEN", "ORCHARD_AGENT_MAX_BODY",
                                  "PYTHONHOME", "PYTHONPATH", "LD_PRELOAD"])
def test_reserved_env_vars_are_refused(api, name):
    assert_refused(api.post("/v1/sandboxes", json={"env": {name: "/etc/hostname"}}), name, "reserved")


async def test_a_spec_that_skipped_validation_still_cannot_replace_the_token(tmp_path):
    """Straight to the backend with an unvalidated spec pointing the token file at /etc/hostname (which the
    host image shows read-only): the agent keeps the token Orchard gave it."""
    backend = local_backend(tmp_path)
    spec = SandboxSpec.model_construct(**{**dict(SandboxSpec()),
                                          "env": {"ORCHARD_AGENT_TOKEN_FILE": "/etc/hostname"}})
    token = secrets.token_hex(16)
    made = await backend.create(f"hijack{secrets.token_hex(3)}", spec, token)
    try:
        async with AgentSandbox(made.id, made.agent_url, token) as agent:
            assert (await agent.exec("true")).ok
        guessed = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").is_file() else "x"
        async with AgentSandbox(made.id, made.agent_url, guessed) as impostor:
            with pytest.raises(AuthError):
                await impostor.exec("true")
    finally:
        await backend.delete(made)


# --- strings the backend cannot use --------------------------------------------------------------------


def test_an_over_long_workdir_is_a_400(api):
    assert_refused(api.post("/v1/sandboxes", json={"workdir": "/" + "a" * 5000}), "workdir", "1024")
    assert_refused(api.post("/v1/sandboxes", json={"workdir": "/" + "b" * 300}), "workdir", "255")


@pytest.mark.parametrize("image", ["/", "//", "/.", "/tmp/.."])
def test_the_hosts_root_is_not_a_rootfs(api, image):
    assert_refused(api.post("/v1/sandboxes", json={"image": image}), "host's root", "image 'host'")


def test_over_long_env_and_labels_are_a_400(api):
    assert_refused(api.post("/v1/sandboxes", json={"env": {"BIG": "x" * 200_000}}), "env", "128 KiB")
    assert_refused(api.post("/v1/sandboxes", json={"labels": {"k" * 200: "v"}}), "labels", "too long")
