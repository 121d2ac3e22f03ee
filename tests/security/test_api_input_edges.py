"""Edge cases of the orchestrator's input, performed against a real `orchard serve` on the real local backend:
workdirs spelled with a leading `//` (pathlib's other root) that named Orchard's own mounts, kernel trees
as images (a 503 from a sandbox that could not start), an owner named like a warm pool's members, a TTL
too small to be anything but zero, a request framed two ways and a chunk size of 18 hex digits (the
server waited for it), and an upload into a full sandbox (a 500). Each is refused with a status and a
message that say what is wrong."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from orchard.core.errors import DiskFull
from orchard.sandbox.agent_client import AgentSandbox
from tests.security.serve_process import API_KEY, MARK, Serve, assert_refused, db_ids, wait_for


# `home`, `server` (as it comes) and `api` are conftest.py's.


def assert_nothing_made(home: Path, before: set[str]) -> None:
    assert db_ids(home) == before
    made = home / "sandboxes"
    assert not [p for p in (made.iterdir() if made.exists() else ()) if p.name not in before]


# --- (a) workdirs under `//` are the same paths as under `/` -------------------------------------------


@pytest.mark.parametrize("workdir", ["//.orchard", "//.orchard/run", "//dev/shm", "//proc", "///dev/./shm/"])
def test_a_double_slash_workdir_is_refused_like_its_single_slash_form(server, api, workdir):
    before = db_ids(server.home)
    assert_refused(api.post("/v1/sandboxes", json={"workdir": workdir}), "workdir", "not usable", "/workspace")
    assert_nothing_made(server.home, before)


def test_a_workdir_is_stored_in_its_normal_form(api):
    response = api.post("/v1/sandboxes", json={"workdir": "//workspace//deep/./", "env": {MARK: "edges"}})
    assert response.status_code == 201, response.text
    try:
        assert response.json()["spec"]["workdir"] == "/workspace/deep"
    finally:
        api.delete(f"/v1/sandboxes/{response.json()['id']}")


# --- (b) kernel trees are not images -------------------------------------------------------------------


@pytest.mark.parametrize("image", ["/proc", "/dev", "/sys", "/proc/1/root", "/proc/self/cwd", "//sys/kernel",
                                   "/tmp/../proc"])
def test_a_kernel_tree_as_image_is_a_400(server, api, image):
    before = db_ids(server.home)
    assert_refused(api.post("/v1/sandboxes", json={"image": image}), repr(image), "kernel", "cannot be a rootfs")
    assert_nothing_made(server.home, before)


# --- (e) the pools' owner prefix is reserved -----------------------------------------------------------


@pytest.mark.parametrize("owner", ["pool:default", "pool:", "pool:x:y"])
def test_an_owner_named_like_a_pools_members_is_a_400(server, api, owner):
    before = db_ids(server.home)
    assert_refused(api.post("/v1/sandboxes", json={}, params={"owner": owner}), "owner", "reserved")
    assert_nothing_made(server.home, before)


# --- (g) a TTL has a minimum ---------------------------------------------------------------------------


@pytest.mark.parametrize("body, field", [
    ('{"timeout_s": 1e-320}', "timeout_s"),
    ('{"timeout_s": 0.001}', "timeout_s"),
    ('{"heartbeat_timeout_s": 5e-324}', "heartbeat_timeout_s"),
])
def test_a_ttl_under_the_minimum_is_a_400(server, api, body, field):
    before = db_ids(server.home)
    response = api.post("/v1/sandboxes", content=body, headers={"Content-Type": "application/json"})
    assert_refused(response, field, "minimum of 1 s")
    assert_nothing_made(server.home, before)


# --- (f) how a request body is framed ------------------------------------------------------------------


def raw_request(server: Serve, data: bytes, *, wait_s: float = 30) -> bytes:
    """Send `data` on a fresh connection; what the server answered until it closed the connection (or until
    `wait_s`, when it did neither: a hang)."""
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.settimeout(wait_s)
        conn.sendall(data)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except socket.timeout:
            answer += b"<no answer: still waiting>"
    return answer


def create_head(*fields: str) -> bytes:
    lines = ["POST /v1/sandboxes HTTP/1.1", "Host: orchard", f"Authorization: Bearer {API_KEY}",
             "Content-Type: application/json", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_content_length_with_transfer_encoding_is_a_400_and_creates_nothing(server):
    before = db_ids(server.home)
    body = b'{"image": "host"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    answer = raw_request(server, create_head(f"Content-Length: {len(chunked)}", "Transfer-Encoding: chunked") + chunked)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"both Content-Length and Transfer-Encoding" in answer, answer
    assert_nothing_made(server.home, before)


@pytest.mark.parametrize("size_line", [b"ffffffffffffffffff", b"100001", b"000000000000ffffffff"])
def test_a_chunk_over_the_body_limit_is_refused_before_its_bytes_come(server, size_line):
    """18 hex digits (what h11 accepts) or just over the 1 MiB limit, followed by a few bytes and then
    nothing: answered 413 at once, not after the client gave up."""
    before = db_ids(server.home)
    log_size = server.log.stat().st_size
    answer = raw_request(server, create_head("Transfer-Encoding: chunked") + size_line + b"\r\n{\"im")
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert b"over this server's body limit" in answer, answer
    assert_nothing_made(server.home, before)
    # Refused, not crashed: the app saw a disconnect and no traceback went to the log.
    assert b"Traceback" not in server.log.read_bytes()[log_size:]
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_chunked_body_within_the_limit_still_creates(server, api):
    body = b'{"env": {"%s": "chunked"}}' % MARK.encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:5], body[5:])) + b"0\r\n\r\n"
    answer = raw_request(server, create_head("Transfer-Encoding: chunked", "Connection: close") + chunked)
    assert answer.startswith(b"HTTP/1.1 201 "), answer
    sandbox_id = answer.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    assert api.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


# --- (c) a full disk is a 507 --------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="disk_mb on the local backend needs root (a size-limited tmpfs)")
async def test_an_upload_into_a_full_sandbox_is_a_507_and_leaves_nothing(api, tmp_path):
    made = api.post("/v1/sandboxes", json={"disk_mb": 4, "env": {MARK: "disk"}})
    assert made.status_code == 201, made.text
    info = made.json()
    try:
        async with AgentSandbox(info["id"], info["agent_url"], info["token"]) as sandbox:
            await sandbox.write_file("kept.txt", b"before")
            with pytest.raises(DiskFull, match="disk is full.*larger disk_mb"):
                await sandbox.write_file("big.bin", b"x" * (8 << 20))
            tree = tmp_path / "tree"
            tree.mkdir()
            (tree / "big.bin").write_bytes(b"y" * (8 << 20))
            with pytest.raises(DiskFull, match="disk is full"):
                await sandbox.upload(tree, "/workspace/tree")
            # Nothing half-written stays (no temp file, no partial tree), and the sandbox goes on serving.
            names = [entry.name for entry in await sandbox.list_dir("/workspace")]
            assert names == ["kept.txt"], names
            assert await sandbox.read_file("kept.txt") == b"before"
            await sandbox.write_file("small.txt", b"fits")
    finally:
        api.delete(f"/v1/sandboxes/{info['id']}")
    wait_for(lambda: api.get(f"/v1/sandboxes/{info['id']}").json()["state"] == "deleted", 30, "the delete")
