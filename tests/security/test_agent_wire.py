"""Attacks on the in-sandbox agent's wire protocol, performed against a real agent process over its real Unix
socket, each asserting the agent now refuses them (security issue #8, the agent-protocol items):
request framing (Content-Length with Transfer-Encoding, repeated Content-Length, oversized chunk sizes),
deeply nested JSON, a tar upload that escapes through a symlink it creates itself, and reads over the
caller's cap."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile

import pytest

from tests.test_agent import RunningAgent

# A guard against a hang, not a timing threshold: every answer here comes at once or never.
HANG_GUARD_S = 30


@pytest.fixture(scope="module")
def agent():
    with RunningAgent() as running:
        yield running


def _auth(agent: RunningAgent) -> bytes:
    return b"Authorization: Bearer %s\r\n" % agent.token.encode()


def _answer_while_open(agent: RunningAgent, data: bytes) -> tuple[int, dict, bytes, bytes]:
    """Send `data` and read the response while our side of the connection stays open (a client that sent
    less than it announced and waits): (status, headers, JSON body, whatever followed until the agent
    closed the connection)."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(HANG_GUARD_S)
        conn.connect(agent.socket_path)
        conn.sendall(data)
        received = b""
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received += chunk
        except socket.timeout:
            pytest.fail("the agent neither answered nor closed the connection: %r" % received[:300])
    head, _, rest = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    return int(lines[0].split()[1]), headers, json.loads(rest[:length]), rest[length:]


def _assert_serves_on(agent: RunningAgent):
    with agent.client() as c:
        assert c.post("/exec", json={"command": "echo still here"}).json()["stdout"] == "still here\n"


# -- request framing ---------------------------------------------------------------------------------------

def test_content_length_with_transfer_encoding_is_refused_and_nothing_is_smuggled(agent, tmp_path):
    """The request-smuggling shape: a front end that honours Content-Length would see one request, one that
    honours chunked two. The agent answers one 400 and closes: the smuggled request never runs."""
    marker = tmp_path / "smuggled"
    smuggled = (b"POST /exec HTTP/1.1\r\n" + _auth(agent) + b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(json.dumps({"command": "touch %s" % marker}))
                + json.dumps({"command": "touch %s" % marker}).encode())
    body = b"0\r\n\r\n" + smuggled
    status, headers, error, after = _answer_while_open(
        agent, b"POST /exec HTTP/1.1\r\n" + _auth(agent) + b"Content-Length: %d\r\n" % len(body)
        + b"Transfer-Encoding: chunked\r\n\r\n" + body)
    assert status == 400 and headers["connection"] == "close"
    assert "both Content-Length and Transfer-Encoding" in error["message"]
    assert after == b""  # one answer, then the connection was closed
    assert not marker.exists()
    _assert_serves_on(agent)


@pytest.mark.parametrize("framing, words", [
    (b"Content-Length: 2\r\nContent-Length: 2\r\n", "more than one Content-Length"),
    (b"Content-Length: 2\r\ncontent-length: 3\r\n", "more than one Content-Length"),
    (b"Content-Length: 2, 2\r\n", "not a non-negative integer"),
    (b"Content-Length: " + b"9" * 40 + b"\r\n", "not a non-negative integer"),
    (b"Transfer-Encoding: gzip, chunked\r\n", "not supported"),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "not supported"),
    (b"Transfer-Encoding: identity\r\n", "not supported"),
])
def test_ambiguous_body_framing_is_refused_before_any_body_is_read(agent, framing, words):
    status, headers, error, _ = _answer_while_open(
        agent, b"POST /exec HTTP/1.1\r\n" + _auth(agent) + framing + b"\r\n{}")
    assert status == 400 and headers["connection"] == "close"
    assert error["error"] == "invalid_request" and words in error["message"], error["message"]
    _assert_serves_on(agent)


@pytest.mark.parametrize("size_line, status, words", [
    (b"1" * 18, 400, "at most 16 hex digits"),  # used to wait for ~2**68 bytes that never come
    (b"fffffffffffffff0", 413, "over the agent's limit"),  # fits 16 digits, over ORCHARD_AGENT_MAX_JSON
    (b"0x10", 400, "bad chunk size"),
    (b"+10", 400, "bad chunk size"),
    (b"1" * 2000, 400, "longer than 1024 bytes"),
])
def test_oversized_or_malformed_chunk_sizes_are_answered_at_once(agent, size_line, status, words):
    status_got, headers, error, _ = _answer_while_open(
        agent, b"POST /exec HTTP/1.1\r\n" + _auth(agent) + b"Transfer-Encoding: chunked\r\n\r\n"
        + size_line + b"\r\n{\"command\": ")
    assert status_got == status and headers["connection"] == "close", error
    assert words in error["message"], error["message"]
    _assert_serves_on(agent)


def test_chunk_over_the_file_body_limit_is_413_before_anything_is_written(agent):
    """The same on a raw file upload (ORCHARD_AGENT_MAX_BODY, 4 GiB): the chunk's size alone is refused."""
    status, _, error, _ = _answer_while_open(
        agent, b"PUT /files?path=big.bin HTTP/1.1\r\n" + _auth(agent) + b"Transfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % (5 << 30) + b"some bytes")
    assert status == 413 and "over the agent's limit" in error["message"]
    assert not os.path.lexists(os.path.join(agent.workdir, "big.bin"))
    assert not [n for n in os.listdir(agent.workdir) if n.startswith(".big.bin")]  # no temp file left


# -- JSON ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [33, 5000, 200_000])
def test_deeply_nested_json_is_a_400_not_a_500(agent, depth):
    body = b'{"command": "true", "env": ' + b"[" * depth + b"]" * depth + b"}"
    with agent.client() as c:
        resp = c.post("/exec", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == "invalid_request" and "levels deep" in resp.json()["message"]
    _assert_serves_on(agent)


def test_json_with_many_brackets_but_shallow_nesting_is_accepted(agent):
    """The depth check must not refuse ordinary bodies that merely contain brackets."""
    with agent.client() as c:
        resp = c.post("/exec", json={"command": "printf %s \"$X\"", "env": {"X": "[{" * 100}})
        assert resp.json()["stdout"] == "[{" * 100
        resp = c.post("/exec", json={"command": ["echo"] + ["[]"] * 100})
        assert resp.json()["exit_code"] == 0


# -- tar uploads through symlinks ------------------------------------------------------------------------------

def _tar(*members: tuple[str, str, bytes | str | None]) -> bytes:
    """A tar of (kind, name, data or link target) members, kind one of file, dir, symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _direct_link(up: str) -> list:
    """`y` points outside from the start."""
    return [("symlink", "y", up)]


def _late_link(up: str) -> list:
    """`y` points inside when it is made (`s/d` is a directory then) and outside once `s/d` is replaced by a
    link to `..`, which itself points inside: only following the links at the time of each member shows
    that `y/...` leaves the target."""
    return [("dir", "s/d", None), ("symlink", "y", "s/d/" + up), ("symlink", "s/d", "..")]


@pytest.mark.parametrize("target_exists", [False, True])
@pytest.mark.parametrize("links", [_direct_link, _late_link])
@pytest.mark.parametrize("through", [
    [("dir", "y/pwned_dir", None)],
    [("file", "y/pwned_file", b"owned")],
    [("dir", "y/a/b/c", None)],
    [("file", "ok.txt", b"fine"), ("dir", "y/pwned_dir", None), ("file", "y/pwned_dir/f", b"x")],
])
def test_tar_upload_through_its_own_symlink_writes_nothing_anywhere(agent, target_exists, links, through):
    """`y -> ../../outside`, then members under `y/`: refused with 400 before a single directory is made
    through the link, and (as the error promises) nothing is written, neither outside nor in the target."""
    outside = os.path.join(agent.dir, "outside")
    os.makedirs(outside, exist_ok=True)
    target = os.path.join(agent.workdir, "up-%s-%s-%d" % (target_exists, links.__name__, len(through)))
    if target_exists:
        os.makedirs(target, exist_ok=True)
    # Uploads are staged in a temp directory inside the target (when it exists) or beside it: the link is
    # made relative to that staging directory, to land exactly on `outside`.
    staging_parent = target if target_exists else os.path.dirname(target)
    up = os.path.relpath(outside, os.path.join(staging_parent, "stage"))
    archive = _tar(*links(up), *through)
    before = sorted(os.listdir(agent.workdir))
    with agent.client() as c:
        resp = c.put("/tar", params={"path": target}, content=archive)
    assert resp.status_code == 400, resp.text
    assert os.listdir(outside) == []
    if target_exists:
        assert os.listdir(target) == []
    else:
        assert not os.path.lexists(target)
    assert sorted(os.listdir(agent.workdir)) == before  # no staging directory left behind
    message = resp.json()["message"]
    assert "symlink pointing outside" in message and "nothing was written" in message


def test_tar_upload_with_a_symlink_inside_the_target_still_works(agent):
    archive = _tar(("dir", "real", None), ("symlink", "link", "real"), ("file", "link/f.txt", b"via link"),
                   ("symlink", "sub/up", ".."), ("file", "sub/up/g.txt", b"up"))
    with agent.client() as c:
        resp = c.put("/tar", params={"path": "inside-links"}, content=archive)
    assert resp.status_code == 200, resp.text
    root = os.path.join(agent.workdir, "inside-links")
    assert open(os.path.join(root, "real", "f.txt"), "rb").read() == b"via link"
    assert open(os.path.join(root, "g.txt"), "rb").read() == b"up"
    assert os.readlink(os.path.join(root, "link")) == "real"


# -- reads over the caller's cap -----------------------------------------------------------------------------

def test_read_over_max_bytes_is_413_with_the_size_before_any_byte_is_sent(agent):
    path = os.path.join(agent.workdir, "sparse.bin")
    with open(path, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse: costs nothing on disk
    try:
        with agent.client() as c:
            resp = c.get("/files", params={"path": "sparse.bin", "max_bytes": str(1 << 20)})
            assert resp.status_code == 413
            assert resp.json()["error"] == "too_large" and str(3 << 30) in resp.json()["message"]
            assert len(resp.content) < 1000
            small = c.get("/files", params={"path": "sparse.bin", "max_bytes": "x"})
            assert small.status_code == 400 and "max_bytes" in small.json()["message"]
    finally:
        os.unlink(path)


@pytest.mark.parametrize("member", [("dir", "y/pwned_dir", None), ("file", "y", b"a file now")])
def test_tar_upload_never_follows_a_symlink_already_in_the_target(agent, member):
    """A link the workload planted in the target (`y -> outside`): the archive's `y/...` or `y` replaces the
    link inside the target and never writes through it."""
    outside = os.path.join(agent.dir, "outside-planted")
    os.makedirs(outside, exist_ok=True)
    target = os.path.join(agent.workdir, "planted-%s" % member[0])
    os.makedirs(target)
    os.symlink(outside, os.path.join(target, "y"))
    with agent.client() as c:
        resp = c.put("/tar", params={"path": target}, content=_tar(member))
    assert resp.status_code == 200, resp.text
    assert os.listdir(outside) == []
    y = os.path.join(target, "y")
    assert not os.path.islink(y)
    if member[0] == "dir":
        assert os.path.isdir(os.path.join(y, "pwned_dir"))
    else:
        assert open(y, "rb").read() == b"a file now"
