"""Owner API keys, on a real `orchard serve` and the real local backend. With one server key any client could
act as any owner, so per-owner caps were dodged by naming another owner each time. An owner key acts for
its owner only, whatever owner the request names: its caps hold, other owners' sandboxes do not exist for
it (404), and an expired or revoked key is refused. The admin key still acts for anyone, and the key file
holds only hashes. Keys are made with the real CLI (`orchard serve keys add|revoke`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from orchard.sandbox.server.api_keys import keys_file, read_keys, write_keys
from tests.security.serve_process import REPO_ROOT, Serve

SPEC = {"image": "host", "timeout_s": 300}


def keys_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    return subprocess.run([sys.executable, "-m", "orchard.cli.main", "serve", "keys", *args, "--home", str(home)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


def add_key(home: Path, owner: str, *args: str) -> str:
    result = keys_cli(home, "add", "--owner", owner, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def key_id(home: Path, owner: str) -> str:
    return next(k.id for k in read_keys(keys_file(home)).keys if k.owner == owner)


@pytest.fixture(scope="module")
def keys(home) -> dict[str, str]:
    return {"alice": add_key(home, "alice", "--max-sandboxes", "1"), "bob": add_key(home, "bob")}


@pytest.fixture(scope="module")
def serve_options(keys) -> dict:
    """The keys are added before the server starts (`home` and `server` are conftest.py's)."""
    return {"args": ["--create-wait-s", "0"]}


def client(server: Serve, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


@pytest.fixture(scope="module")
def alice(server, keys) -> Iterator[httpx.Client]:
    with client(server, keys["alice"]) as c:
        yield c


@pytest.fixture(scope="module")
def bob(server, keys) -> Iterator[httpx.Client]:
    with client(server, keys["bob"]) as c:
        yield c


@pytest.fixture(scope="module")
def admin(server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def alices_sandbox(alice, admin) -> Iterator[str]:
    # The owner the client claims is not the owner it gets: naming another owner is refused...
    claimed = alice.post("/v1/sandboxes", params={"owner": "mallory"}, json=SPEC)
    assert claimed.status_code == 403 and claimed.json()["error"] == "forbidden", claimed.text
    # ...and without a name the sandbox is the key's owner's.
    created = alice.post("/v1/sandboxes", json=SPEC)
    assert created.status_code == 201, created.text
    assert created.json()["owner"] == "alice"
    yield created.json()["id"]
    admin.delete(f"/v1/sandboxes/{created.json()['id']}")


def test_the_key_file_holds_only_hashes(home, keys):
    text = keys_file(home).read_text()
    for key in keys.values():
        assert key not in text
        assert hashlib.sha256(key.encode()).hexdigest() in text
    assert keys_file(home).stat().st_mode & 0o077 == 0
    listed = keys_cli(home, "list")
    assert listed.returncode == 0 and "alice" in listed.stdout and keys["alice"] not in listed.stdout


def test_a_keys_cap_holds_whatever_owner_the_client_names(alice, bob, alices_sandbox):
    for claimed in ({}, {"owner": "alice"}):
        full = alice.post("/v1/sandboxes", params=claimed, json=SPEC)
        assert full.status_code == 429 and "'alice' is at its cap of 1" in full.json()["message"], full.text
    dodge = alice.post("/v1/sandboxes", params={"owner": "someone-else"}, json=SPEC)
    assert dodge.status_code == 403 and "cannot create sandboxes for 'someone-else'" in dodge.json()["message"]
    stats = alice.get("/v1/stats").json()
    assert stats["by_owner"] == {"alice": 1}  # nobody else's counts are shown to an owner key
    # bob's cap is his own: alice being full does not stop him
    made = bob.post("/v1/sandboxes", json=SPEC)
    assert made.status_code == 201 and made.json()["owner"] == "bob", made.text
    assert bob.delete(f"/v1/sandboxes/{made.json()['id']}").status_code == 204


def test_another_owners_sandbox_does_not_exist_for_a_key(alice, bob, admin, alices_sandbox):
    path = f"/v1/sandboxes/{alices_sandbox}"
    for response in (bob.get(path), bob.post(f"{path}/wait", params={"timeout": 1}),
                     bob.post(f"{path}/heartbeat"), bob.delete(path)):
        assert response.status_code == 404 and response.json()["error"] == "sandbox_not_found", response.text
    assert [s["id"] for s in bob.get("/v1/sandboxes").json()["sandboxes"]] == []
    assert bob.get("/v1/sandboxes", params={"owner": "alice"}).json()["sandboxes"] == []
    assert bob.put("/v1/pools", json={"pools": []}).status_code == 403  # server settings: admin only
    # still there, and alice and the admin key see it
    assert alice.get(path).json()["state"] == "ready"
    assert alice.post(f"{path}/heartbeat").status_code == 200
    assert [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]] == [alices_sandbox]
    assert alices_sandbox in [s["id"] for s in admin.get("/v1/sandboxes").json()["sandboxes"]]


def test_the_admin_key_still_acts_for_any_owner(admin):
    made = admin.post("/v1/sandboxes", params={"owner": "carol"}, json=SPEC)
    assert made.status_code == 201 and made.json()["owner"] == "carol", made.text
    assert admin.delete(f"/v1/sandboxes/{made.json()['id']}").status_code == 204


def test_a_revoked_key_is_refused_without_a_restart(home, server):
    key = add_key(home, "dave")
    with client(server, key) as dave:
        assert dave.get("/v1/sandboxes").status_code == 200
        result = keys_cli(home, "revoke", key_id(home, "dave"))
        assert result.returncode == 0, result.stderr
        refused = dave.get("/v1/sandboxes")
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    unknown = keys_cli(home, "revoke", "k-000000000000")
    assert unknown.returncode == 2 and "no API key" in unknown.stderr


def test_an_expired_key_is_refused(home, server):
    key = add_key(home, "erin", "--expires", "1h")
    with client(server, key) as erin:
        assert erin.get("/v1/sandboxes").status_code == 200
        stored = read_keys(keys_file(home))
        for entry in stored.keys:
            if entry.owner == "erin":
                entry.expires_at = time.time() - 1  # as if the hour had passed
        write_keys(keys_file(home), stored)
        refused = erin.get("/v1/sandboxes")
        assert refused.status_code == 401 and "expired" in refused.json()["message"], refused.text


def test_key_mistakes_are_said_plainly(home):
    bad_owner = keys_cli(home, "add", "--owner", "pool:x")
    assert bad_owner.returncode == 2 and "an owner is 1 to 100" in " ".join(bad_owner.stderr.split())
    past = keys_cli(home, "add", "--owner", "frank", "--expires", "2001-01-01")
    assert past.returncode == 2 and "in the past" in past.stderr
