"""The agent's own HTTP/1.1 layer, spoken to with raw bytes over its real Unix socket: what clients like httpx
never send (malformed request lines and headers, oversized heads, pipelining, HTTP/1.0, folded headers,
Expect: 100-continue) and what the agent's start must not import."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.test_agent import AGENT_DIR, RunningAgent


@pytest.fixture(scope="module")
def agent():
    with RunningAgent() as running:
        yield running


def _exchange(agent: RunningAgent, data: bytes) -> bytes:
    """Send `data`, half-close, and read everything until the agent closes the connection."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(10)
        conn.connect(agent.socket_path)
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return received
            received += chunk


def _responses(raw: bytes) -> list[tuple[int, dict, bytes]]:
    """(status, headers, body) of each response in a byte stream of Content-Length responses."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if lines[0].split()[1] == "100":
            found.append((100, headers, b""))
            raw = rest
            continue
        length = int(headers["content-length"])
        found.append((int(lines[0].split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return found


def _only(raw: bytes, status: int) -> dict:
    """The one response's JSON body, checked to have `status`."""
    (got, headers, body), = _responses(raw)
    assert got == status, body
    return json.loads(body)


def _refused(raw: bytes, status: int, words: str):
    """A refusal: the status, a JSON error naming what is wrong, and the connection closed."""
    (got, headers, body), = _responses(raw)
    assert got == status, body
    assert headers["connection"] == "close"
    error = json.loads(body)
    assert error["error"] == ("invalid_request" if status < 500 else "error")
    assert words in error["message"], error["message"]


AUTH = b"Authorization: Bearer %s\r\n"


@pytest.mark.parametrize("request_bytes, status, words", [
    (b"hello\r\n\r\n", 400, "malformed request line"),
    (b"GET /health\r\n\r\n", 400, "malformed request line"),
    (b"GET /health HTTP/x\r\n\r\n", 400, "bad HTTP version"),
    (b"GET /health HTTP/2.0\r\n\r\n", 505, "HTTP/1.1"),
    (b"G(T /health HTTP/1.1\r\n\r\n", 400, "malformed method"),
    (b"PATCH /health HTTP/1.1\r\n\r\n", 405, "PATCH"),
    (b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header line"),
    (b"GET /health HTTP/1.1\r\n X-Folded: first line\r\n\r\n", 400, "whitespace"),
    (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "request line is longer"),
    (b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", 431, "header line is longer"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n", 431,
     "over the agent's limit"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70)) + b"\r\n",
     431, "over the agent's limit"),
])
def test_malformed_and_oversized_heads_are_refused_and_the_agent_serves_on(agent, request_bytes, status,
                                                                             words):
    _refused(_exchange(agent, request_bytes), status, words)
    assert _only(_exchange(agent, b"GET /health HTTP/1.1\r\n\r\n"), 200)["status"] == "ok"


def test_bad_and_conflicting_content_lengths_are_400s(agent):
    token = AUTH % agent.token.encode()
    for lengths in (b"Content-Length: +5\r\n", b"Content-Length: 1_0\r\n",
                    b"Content-Length: 5\r\nContent-Length: 6\r\n"):
        raw = _exchange(agent, b"POST /exec HTTP/1.1\r\n" + token + lengths + b"\r\n{}   ")
        (status, _, body), = _responses(raw)
        assert status == 400 and "Content-Length" in json.loads(body)["message"]


def test_keep_alive_pipelining_and_connection_close(agent):
    two = _responses(_exchange(agent, b"GET /health HTTP/1.1\r\n\r\n"
                                      b"GET /health HTTP/1.1\r\nconnection: Close\r\n\r\n"
                                      b"GET /health HTTP/1.1\r\n\r\n"))
    assert [status for status, _, _ in two] == [200, 200]  # nothing is answered after `Connection: close`
    assert "connection" not in two[0][1] and two[1][1]["connection"] == "close"
    # HTTP/1.0 closes after one response unless it asks for keep-alive.
    assert len(_responses(_exchange(agent, b"GET /health HTTP/1.0\r\n\r\nGET /health HTTP/1.0\r\n\r\n"))) == 1
    kept = _exchange(agent, b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /health HTTP/1.0\r\n\r\n")
    assert len(_responses(kept)) == 2


def test_chunked_body_expect_continue_and_header_forms(agent):
    token = AUTH % agent.token.encode()
    body = json.dumps({"command": "echo chunked"}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:])) + b"0\r\n\r\n"
    raw = _exchange(agent, b"POST /exec HTTP/1.1\r\n" + token + b"Expect: 100-continue\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    (continue_status, _, _), (status, _, answer) = _responses(raw)
    assert (continue_status, status) == (100, 200) and json.loads(answer)["stdout"] == "chunked\n"
    # Header names in any case, a folded header, a leading empty line and a `//` path all work.
    raw = _exchange(agent, b"\r\nGET //sessions HTTP/1.1\r\nauthorization: bearer %s\r\nX-Folded: a\r\n b\r\n\r\n"
                    % agent.token.encode())
    assert _only(raw, 200) == {"sessions": []}
    # A head cut off by the client gets no answer: there is nobody left to read one.
    assert _exchange(agent, b"GET /health HTTP/1.1\r\nX-A: 1\r\n") == b""


def test_start_path_imports_no_endpoint_only_or_http_server_modules(tmp_path):
    """Every module the agent imports at start delays every sandbox's creation: http.server (and with it
    http.client and email) is not used, and what only some endpoints need is imported by them."""
    shutil.copytree(AGENT_DIR, tmp_path / "orchard_agent", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys, orchard_agent.__main__, orchard_agent.server; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True,
                                text=True, check=True).stdout.split())
    assert "orchard_agent.server" in loaded
    late = {"http.server", "http.client", "email", "argparse", "tarfile", "tempfile", "shutil", "urllib.parse",
            "hmac", "hashlib", "secrets", "traceback"}
    assert not late & loaded


def test_command_line_forms_and_help(tmp_path):
    env = dict(os.environ, ORCHARD_AGENT_TOKEN="t")
    agent = [sys.executable, "-m", "orchard.sandbox.agent"]
    helped = subprocess.run(agent + ["--help"], env=env, capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and "--listen" in helped.stdout
    missing = subprocess.run(agent + ["--workdir", str(tmp_path)], env=env, capture_output=True, text=True,
                             timeout=30)
    assert missing.returncode == 2 and "--listen" in missing.stderr
    typo = subprocess.run(agent + ["--listen", "tcp:127.0.0.1:0", "--wrokdir", "x"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert typo.returncode == 2 and "--wrokdir" in typo.stderr
    # `--opt=value` works like `--opt value`, and so do argparse's abbreviations.
    for argv in (["--listen=tcp:127.0.0.1:0", "--workdir=%s" % tmp_path],
                 ["--list", "tcp:127.0.0.1:0", "--workd", str(tmp_path)]):
        proc = subprocess.Popen(agent + argv, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().startswith("READY tcp:127.0.0.1:")
        finally:
            proc.terminate()
            proc.wait(10)
            proc.stdout.close()
