"""Sandbox ports: what reaching a server inside a sandbox through its agent adds, against the same client
on a direct loopback connection to the same server running on the host, in one run.

The server is the conformance suite's echo server (python, a thread per connection) both times. Through
`open_port` the path is client → the agent's Unix socket → the agent's relay threads → loopback in the
sandbox's network namespace; through `forward_port` a local TCP port and the client's relay threads come
first. Round trips are 1 KiB each way on one kept connection; throughput is 64 MiB sent while a second
thread reads the echo back."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack

from bench.latency import echo_round_trips, measure_interleaved
from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target

LATENCY_RATIO_TARGET = 1.5
THROUGHPUT_SHARE_TARGET = 0.5
PAYLOAD = b"x" * 1024
PORT = 7007
HTTP_PORT = 7008
# A keep-alive HTTP/1.1 server answering every GET with a small JSON body (stdlib, a thread per connection).
HTTP_PY = r"""
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body are two writes
    def do_GET(self):
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def run(ctx: BenchContext) -> Findings:
    from orchard import Orchard
    from orchard.testing.conformance.ports import ECHO_PY, start_echo

    import httpx

    with ExitStack() as stack:
        direct_port = _host_server(stack, ECHO_PY)
        direct_http = _host_server(stack, HTTP_PY)
        orchard = stack.enter_context(Orchard())
        sandbox = stack.enter_context(orchard.create())
        start_echo(sandbox, PORT)
        sandbox.write_file("/tmp/http-server.py", HTTP_PY)
        sandbox.exec(f"nohup python3 /tmp/http-server.py {HTTP_PORT} >/dev/null 2>&1 &")
        forward = stack.enter_context(sandbox.forward_port(PORT))
        forward_http = stack.enter_context(sandbox.forward_port(HTTP_PORT))
        http = {"direct": stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{direct_http}")),
                "forward_port": stack.enter_context(httpx.Client(base_url=forward_http.url()))}
        for _ in range(100):  # until the server inside answers
            try:
                http["forward_port"].get("/")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        conns = {"direct": socket.create_connection(("127.0.0.1", direct_port)),
                 "open_port": sandbox.open_port(PORT),
                 "forward_port": socket.create_connection((forward.host, forward.port))}
        for conn in conns.values():
            stack.callback(conn.close)
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stats = measure_interleaved({name: echo_round_trips(conn, PAYLOAD) for name, conn in conns.items()},
                                    warmup=200, runs=ctx.pick(20000, 2000), rounds=ctx.pick(20, 4))
        http_stats = measure_interleaved({name: _gets(client) for name, client in http.items()}, warmup=50,
                                         runs=ctx.pick(4000, 400), rounds=ctx.pick(20, 4))
        size = ctx.pick(64, 8) << 20
        rates = {name: max(_throughput(connect, size) for _ in range(ctx.pick(3, 1))) for name, connect in {
            "direct": lambda: socket.create_connection(("127.0.0.1", direct_port)),
            "open_port": lambda: sandbox.open_port(PORT),
            "forward_port": lambda: socket.create_connection((forward.host, forward.port))}.items()}
    direct = stats["direct"].p50_ms
    rows = []
    for name in ("open_port", "forward_port"):
        rows.append(Row(metric=f"1 KiB echo round trip p50 through {name}", unit="µs",
                        ours=stats[name].p50_ms * 1000, peers={"direct loopback": direct * 1000},
                        ratios={f"{name}/direct": stats[name].p50_ms / direct},
                        targets=[Target(on=f"{name}/direct", op="<=", limit=LATENCY_RATIO_TARGET)]))
    rows.append(Row(metric="HTTP GET round trip p50 (httpx, keep-alive) through forward_port", unit="µs",
                    ours=http_stats["forward_port"].p50_ms * 1000,
                    peers={"direct loopback": http_stats["direct"].p50_ms * 1000},
                    ratios={"forward_port/direct": http_stats["forward_port"].p50_ms / http_stats["direct"].p50_ms},
                    targets=[Target(on="forward_port/direct", op="<=", limit=LATENCY_RATIO_TARGET)]))
    for name in ("open_port", "forward_port"):
        rows.append(Row(metric=f"echo throughput through {name}", unit="MiB/s", ours=rates[name],
                        peers={"direct loopback": rates["direct"]},
                        ratios={f"{name}/direct": rates[name] / rates["direct"]},
                        targets=[Target(on=f"{name}/direct", op=">=", limit=THROUGHPUT_SHARE_TARGET)]))
    latencies = {**stats, **{f"http {name}": value for name, value in http_stats.items()}}
    return Findings(rows=rows, latencies=latencies, notes=[
        "The direct peer is the same echo server on the host's loopback: the ratios are what the agent's "
        "relay (and, for forward_port, the client's) add to a connection, not the server's own time.",
        "Throughput counts the bytes sent (the echo brings as many back at once).",
        "open_port on the local backend is the server's own connection, handed over by the agent (no relay): "
        "its ratios are noise around 1. forward_port adds one relay on the client's side (a thread per "
        "direction): on a bare 1 KiB echo of ~25 µs that hop is about as long again (the miss), on a real "
        "request (the HTTP row) it is a fraction. On Kubernetes, where the agent is reached over TCP, the "
        "agent relays too.",
    ])


def _host_server(stack: ExitStack, program: str) -> int:
    """Start `program` on the host (port 0: a free one) until the bench ends; its port."""
    server = subprocess.Popen([sys.executable, "-c", program, "0"], stdout=subprocess.DEVNULL)
    stack.callback(server.wait)
    stack.callback(server.kill)
    return _listening_port(server.pid)


def _gets(client):
    def block(k: int) -> list[float]:
        durations = []
        for _ in range(k):
            started = time.perf_counter()
            client.get("/").raise_for_status()
            durations.append(time.perf_counter() - started)
        return durations
    return block


def _listening_port(pid: int) -> int:
    """The port the echo server (started on port 0) bound, from /proc/<pid>/net/tcp's listening sockets."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        inodes = _socket_inodes(pid)
        with open(f"/proc/{pid}/net/tcp") as table:
            for line in list(table)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    return int(fields[1].split(":")[1], 16)
        time.sleep(0.05)
    raise RuntimeError("the host's echo server did not start listening")


def _socket_inodes(pid: int) -> set[str]:
    import os

    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _throughput(connect, size: int) -> float:
    """MiB/s of `size` bytes sent while another thread reads the echo back."""
    conn = connect()
    chunk = b"y" * (256 << 10)
    received = 0

    def drain() -> None:
        nonlocal received
        while data := conn.recv(1 << 20):
            received += len(data)

    with conn:
        reader = threading.Thread(target=drain)
        started = time.perf_counter()
        reader.start()
        for _ in range(size // len(chunk)):
            conn.sendall(chunk)
        conn.shutdown(socket.SHUT_WR)
        reader.join()
        elapsed = time.perf_counter() - started
    if received != size:
        raise RuntimeError(f"the echo brought back {received} of {size} bytes")
    return size / elapsed / (1 << 20)


MEASUREMENT = Measurement(
    name="ports",
    title="Sandbox ports: a server inside reached through the agent",
    method=("A local sandbox runs an echo server on port 7007; the same server runs on the host. One client "
            "makes 1 KiB round trips on a kept connection through `open_port` (the agent's relay), "
            "`forward_port` (a local port, then the agent's relay) and straight to the host's server on "
            "loopback, in alternating blocks over several rounds; then each path echoes 64 MiB (best of 3)."),
    run=run,
)
