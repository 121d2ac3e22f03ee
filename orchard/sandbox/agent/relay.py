"""Bytes both ways between two connections: the model gateway's forwarder (forward.py) and a client's
connection to a port inside the sandbox (ports.py) relay the same way.

Two threads per pair (one per direction), each a plain read/sendall loop: no buffering beyond one read,
and nothing to schedule. When one side ends its sending, the other side's sending is shut down
(half-close); when either fails, both are cut, so the other direction ends too."""

from __future__ import annotations

import socket
import threading

CHUNK = 64 << 10


def relay(a_read, a: socket.socket, b: socket.socket, name: str) -> None:
    """Relay until both directions are done. `a_read(n)` reads from `a` (the socket's own recv, or a
    buffered reader's read1 that first returns what was read ahead of the relay)."""
    back = threading.Thread(target=pump, args=(b.recv, b, a), name=name, daemon=True)
    back.start()
    pump(a_read, a, b)
    back.join()


def pump(read, src: socket.socket, dst: socket.socket) -> None:
    """Copy what `read` returns (from src) to dst until src ends (then half-close dst) or either fails
    (then cut both, so that the other direction's pump ends too)."""
    try:
        while True:
            data = read(CHUNK)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)
    except (OSError, ValueError):  # ValueError: a buffered reader closed under the pump
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
