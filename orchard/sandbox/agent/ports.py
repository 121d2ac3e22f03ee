"""`GET /ports/<port>`: a TCP connection to a port inside the sandbox, through the agent (docs/agent-protocol.md,
"Ports"). The client asks for the upgrade (`Connection: Upgrade`, `Upgrade: orchard-tcp`, the sandbox's
token as for every endpoint); the agent connects to the port on the loopback of the sandbox's own network
namespace (127.0.0.1, then ::1), answers `101 Switching Protocols`, and from then on the connection
carries that port's bytes both ways until either side closes (relay.py). Nothing of the bytes is read:
HTTP, WebSocket (a browser's CDP endpoint), MCP over HTTP all pass as they are.

A client on the agent's Unix socket may offer `orchard-fd` first (`Upgrade: orchard-fd, orchard-tcp`):
the agent then hands it the connected socket itself (SCM_RIGHTS, with the 101 answer's first byte) and
relays nothing, so the client talks to the port with no hop between (the local and Docker backends).

Only the sandbox's own ports: the agent dials loopback in its own namespace, which no other sandbox and
nothing of the host shares. Where the backend gave the sandbox the host's network namespace (the local
backend's network 'open' without a gateway: `ORCHARD_AGENT_HOST_NETWORK=1`) its loopback is the host's,
so the agent refuses every port there rather than reach the host's services."""

from __future__ import annotations

import array
import os
import socket
import struct
import threading

from . import own_proc
from .relay import relay
from .wire import ApiError

UPGRADE = "orchard-tcp"
UPGRADE_FD = "orchard-fd"
CONNECT_TIMEOUT_S = 10.0
# Relayed connections at once: each holds two of the agent's threads, which count against its own process
# limit, and a tunnel left idle holds them for as long as the client keeps it.
MAX_TUNNELS = 64
HOST_NETWORK_ENV = "ORCHARD_AGENT_HOST_NETWORK"
LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))
# sock_diag (linux/sock_diag.h, inet_diag.h, netlink.h)
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, TCP_LISTEN = 4, 20, 10
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 0x1, 0x300, 2, 3

_slots = threading.BoundedSemaphore(MAX_TUNNELS)


def handle_connect(req, port_text: str):
    port = _port(port_text)
    handler = req.handler
    offered = [t.strip().lower() for t in (handler.headers.get("Upgrade") or "").split(",")]
    connection = {t.strip().lower() for t in (handler.headers.get("Connection") or "").split(",")}
    if not {UPGRADE, UPGRADE_FD} & set(offered) or "upgrade" not in connection:
        raise ApiError(400, "invalid_request", "GET %s opens a connection to the port: send 'Connection: "
                       "Upgrade' and 'Upgrade: %s' (see docs/agent-protocol.md, Ports)" % (req.path, UPGRADE))
    if os.environ.get(HOST_NETWORK_ENV) == "1":
        raise ApiError(400, "invalid_request", "this sandbox shares the host's network (network 'open' on the "
                       "local backend), so it has no ports of its own to open; create it with network "
                       "'none' or 'allowlist' to reach ports inside it")
    client = handler.connection
    if UPGRADE_FD in offered and client.family == socket.AF_UNIX:
        return _hand_over(req, _dial(port))
    if UPGRADE not in offered:
        raise ApiError(400, "invalid_request", "%s can only be handed over on the agent's Unix socket; offer "
                       "'Upgrade: %s' to have it relayed" % (UPGRADE_FD, UPGRADE))
    if not _slots.acquire(blocking=False):
        raise ApiError(503, "error", "%d port connections are open on this sandbox already; close some first"
                       % MAX_TUNNELS)
    try:
        upstream = _dial(port)
        try:
            handler.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n"
                                 % UPGRADE).encode("latin-1"))
            req.responded = True
            handler.close_connection = True  # the connection is the port's now
            client.settimeout(None)  # a tunnel may idle as long as its protocol does (a CDP session)
            if client.family != socket.AF_UNIX:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # read1: what the client sent right behind the request head is in the reader's buffer already.
            relay(handler.rfile.read1, client, upstream, "port-relay")
        finally:
            upstream.close()
    finally:
        _slots.release()


def handle_list(req) -> dict:
    """`GET /ports`: the TCP ports listening in the sandbox's network namespace that `GET /ports/<port>`
    can reach (bound to a loopback or to every address), asked of the kernel (the agent's own namespace's),
    so a client can wait for a server without connecting to it."""
    return {"listening": sorted(listening())}


def listening() -> set:
    if os.environ.get(HOST_NETWORK_ENV) == "1":
        return set()  # the host's, not the sandbox's: none can be opened
    try:
        return _listening_by_netlink()
    except OSError:  # no sock_diag here (a seccomp profile, an old kernel): the socket tables instead
        return _listening_by_proc()


def _listening_by_netlink() -> set:
    """The kernel's sock_diag (as `ss -ltn` asks it): only listening sockets of this network namespace, from
    the small listening table. /proc/net/tcp walks every socket of the host to filter them: milliseconds on
    a busy host, which a client waiting for a port pays on every poll."""
    found = set()
    for family, reachable in ((socket.AF_INET, (bytes(4), bytes([127, 0, 0, 1]))),
                              (socket.AF_INET6, (bytes(16), bytes(15) + b"\x01"))):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        try:
            request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + bytes(48)
            sock.sendto(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY,
                                    NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + request, (0, 0))
            while True:
                data, offset = sock.recv(1 << 16), 0
                while offset + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, offset)
                    if kind == NLMSG_DONE:
                        break
                    if kind == NLMSG_ERROR or length < 16:
                        raise OSError("sock_diag refused the dump")
                    port = struct.unpack_from(">H", data, offset + 20)[0]  # inet_diag_msg.id.idiag_sport
                    address = data[offset + 24:offset + 24 + (4 if family == socket.AF_INET else 16)]
                    if address in reachable:
                        found.add(port)
                    offset += (length + 3) & ~3
                else:
                    continue
                break
        finally:
            sock.close()
    return found


def _listening_by_proc() -> set:
    found = set()
    for table, reachable in (("self/net/tcp", ("0100007F", "00000000")),
                             ("self/net/tcp6", ("00000000000000000000000001000000",
                                                "00000000000000000000000000000000"))):
        try:
            # The agent's own /proc: the workload's (pidns.py) has no `self` for the agent.
            with own_proc.open_proc(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:  # no IPv6 in this namespace
            continue
        for line in lines:
            fields = line.split()
            address, _, port = fields[1].partition(":")
            if fields[3] == "0A" and address in reachable:  # 0A: LISTEN
                found.add(int(port, 16))
    return found


def _hand_over(req, upstream: socket.socket) -> None:
    """Send the connected socket to the client with the 101 answer, and end this connection."""
    head = ("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n"
            % UPGRADE_FD).encode("latin-1")
    try:
        req.responded = True
        req.handler.close_connection = True
        # sendmsg, not socket.send_fds: the agent runs on Python 3.8 too.
        req.handler.connection.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                 array.array("i", [upstream.fileno()]))])
    finally:
        upstream.close()  # the client holds its own copy now


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ApiError(400, "invalid_request", "port %r is not a TCP port number (1-65535)" % text)
    return int(text)


def _dial(port: int) -> socket.socket:
    refused = None
    for family, address in LOOPBACKS:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect((address, port))
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            refused = refused or exc
    raise ApiError(502, "port_closed", "nothing listens on port %d inside the sandbox (127.0.0.1 and ::1: %s); "
                   "start the server there first, listening on 127.0.0.1 or 0.0.0.0"
                   % (port, (refused.strerror if refused and refused.strerror else refused)))
