"""`POST /exec/attach`: a command whose stdin and stdout are the connection itself (docs/agent-protocol.md,
"Attach"): the body is an ExecRequest (`command`, `cwd`, `env`; no `stdin`), sent with `Connection: Upgrade`
and `Upgrade: orchard-attach`. Once the command has started, the agent answers `101 Switching Protocols`;
from then on what the client sends is the command's stdin and what the command writes to stdout comes back
(its stderr is kept: the last 64 KiB go to the agent's log when it ends). This is how a client talks to a
long-lived program inside the sandbox, e.g. an MCP server over stdio.

The command runs like `POST /exec`'s, as the commands' user in their namespace and process group. When the
client half-closes, the command's stdin is closed; when the command's stdout ends, the client's receiving
side ends; when the connection goes, the command's process group is killed (after STOP_GRACE_S for it to
end by itself). A `timeout` bounds the whole attachment."""

from __future__ import annotations

import socket
import sys
import threading
import time

from .execs import ExecSpec, CommandRun
from .wire import ApiError, bad_request

UPGRADE = "orchard-attach"
STOP_GRACE_S = 2.0
STDERR_KEPT = 64 << 10


def handle_attach(req):
    handler = req.handler
    offered = [t.strip().lower() for t in (handler.headers.get("Upgrade") or "").split(",")]
    connection = {t.strip().lower() for t in (handler.headers.get("Connection") or "").split(",")}
    if UPGRADE not in offered or "upgrade" not in connection:
        raise ApiError(400, "invalid_request", "POST /exec/attach attaches the connection to the command: send "
                       "'Connection: Upgrade' and 'Upgrade: %s' (see docs/agent-protocol.md, Attach)" % UPGRADE)
    body = req.json()
    if "stdin" in body:
        raise bad_request("an attached command's stdin is the connection; send no 'stdin'")
    spec = ExecSpec(body, req.context)
    spec.stdin = b""  # a pipe, fed from the connection below
    run = CommandRun(spec)
    if run.proc is None:
        raise ApiError(400, "invalid_request", "cannot run %r: %s" % (spec.argv[0], run.spawn_error.strerror))
    proc = run.proc
    try:
        handler.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n"
                             % UPGRADE).encode("latin-1"))
        req.responded = True
        handler.close_connection = True
        client = handler.connection
        # The attachment's own bound: a client that sends nothing is cut off at its timeout, not waited on.
        client.settimeout(None if run.deadline is None else max(run.deadline - time.monotonic(), 0.001))
        stderr = bytearray()
        threads = [threading.Thread(target=_drain, args=(proc.stderr, stderr), daemon=True),
                   threading.Thread(target=_to_client, args=(proc.stdout, client), daemon=True)]
        for thread in threads:
            thread.start()
        _to_command(handler.rfile, proc.stdin, run.deadline)
        end = time.monotonic() + STOP_GRACE_S
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        threads[1].join(STOP_GRACE_S)  # what it wrote before ending still reaches the client
    finally:
        if proc.poll() is None:
            run.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
    if stderr:
        sys.stderr.write("orchard-agent: attached %r ended (%s); its stderr ends: %s\n"
                         % (spec.argv[-1][:80], proc.returncode, bytes(stderr).decode("utf-8", "replace")))


def _to_command(rfile, stdin, deadline):
    """The client's bytes to the command's stdin until the client half-closes (or goes, or time is up: the
    connection's timeout ends a read that waits past it)."""
    try:
        while deadline is None or time.monotonic() < deadline:
            data = rfile.read1(65536)
            if not data:
                break
            stdin.write(data)
            stdin.flush()
    except (OSError, ValueError):
        pass
    try:
        stdin.close()
    except OSError:
        pass


def _to_client(stdout, client):
    try:
        while True:
            data = stdout.read1(65536)
            if not data:
                break
            client.sendall(data)
        client.shutdown(socket.SHUT_WR)
    except (OSError, ValueError):
        try:
            client.shutdown(socket.SHUT_RDWR)  # the client is gone: wake the reader of its bytes
        except OSError:
            pass


def _drain(stderr, kept: bytearray):
    try:
        while True:
            data = stderr.read1(65536)
            if not data:
                return
            kept += data
            del kept[:-STDERR_KEPT]
    except (OSError, ValueError):
        pass
