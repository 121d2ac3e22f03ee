"""Model-only networking: a chat call's round trip from inside a sandbox (`network.mode = "model"`, through
the agent's forwarder at 127.0.0.1:4000 and the gateway's Unix socket) against the same call made from
the host straight to the gateway's TCP port. The difference is what the forwarder adds."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.latency import echo_round_trips, measure_interleaved
from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target

ADDED_P50_TARGET_MS = 1.0
WARMUP_CALLS = 5  # per block, untimed: the connection and the gateway's first call on it
# One client process per block: keep-alive HTTP/1.1 to the gateway, one chat call at a time, each timed
# inside the process (its start is not counted). Prints the durations in seconds as JSON.
CLIENT = r"""
import http.client, json, sys, time
host, port, path, key, calls, warmup = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "ping"}]}).encode()
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
conn = http.client.HTTPConnection(host, port)
durations = []
for i in range(warmup + calls):
    started = time.perf_counter()
    conn.request("POST", path, body, headers)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        sys.exit("status %d" % response.status)
    if i >= warmup:
        durations.append(time.perf_counter() - started)
print(json.dumps(durations))
"""


def run(ctx: BenchContext) -> Findings:
    from orchard.core.sandbox import MODEL_GATEWAY_HOST, MODEL_GATEWAY_PORT, NetworkPolicy, SandboxSpec
    from orchard.eval.local_gateway import LocalGateway
    from orchard.gateway.config import GatewayConfig, ModelRoute
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.backends.local import LocalBackend
    from orchard.testing.scripted_model import create_scripted_app
    from orchard.testing.scripted_script import Script
    from orchard.util.uvicorn_thread import ServerThread

    runs, rounds = ctx.pick(600, 60), ctx.pick(12, 3)
    key = "bench-model-network"
    path = f"/r/{key}/v1/chat/completions"
    with asyncio.Runner() as runner, ExitStack() as stack:
        script = Script.parse({"responses": [{"content": "pong"}], "loop": True}, where="bench")
        model = stack.enter_context(ServerThread(create_scripted_app(script), what="the scripted model"))
        gateway = stack.enter_context(LocalGateway(GatewayConfig(models={"policy": ModelRoute(
            model="openai/scripted", api_base=f"{model.url}/v1", api_key="unused")})))
        api_key = gateway.rollout_api_key(key)
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orchard-bench-")))
        backend = LocalBackend(root / "sandboxes", model_gateway=gateway.model_gateway)
        token = secrets.token_hex(16)
        made = runner.run(backend.create("bench-model", SandboxSpec(network=NetworkPolicy(mode="model")), token))
        agent = AgentSandbox(made.id, made.agent_url, token)
        stack.callback(lambda: runner.run(backend.delete(made)))
        stack.callback(lambda: runner.run(agent.close()))

        def inside(k: int) -> list[float]:
            result = runner.run(agent.exec([sys.executable, "-c", CLIENT, MODEL_GATEWAY_HOST,
                                            str(MODEL_GATEWAY_PORT), path, api_key, str(k), str(WARMUP_CALLS)]))
            if result.exit_code != 0:
                raise RuntimeError(f"the in-sandbox client failed: {result.stderr}")
            return json.loads(result.stdout)

        def direct(k: int) -> list[float]:
            out = subprocess.run([sys.executable, "-c", CLIENT, "127.0.0.1", str(gateway.port), path, api_key,
                                  str(k), str(WARMUP_CALLS)], capture_output=True, text=True, check=True)
            return json.loads(out.stdout)

        stats = measure_interleaved({"forwarder": inside, "direct": direct}, warmup=1, runs=runs, rounds=rounds)
        gateway.end_rollout(key)
    through, straight = stats["forwarder"], stats["direct"]
    added = through.p50_ms - straight.p50_ms
    relay, socket_only = _relay_alone(ctx)
    return Findings(rows=[
        Row(metric="chat round trip p50, in-sandbox through the forwarder", unit="ms", ours=through.p50_ms,
            peers={"host → gateway directly": straight.p50_ms},
            ratios={"forwarder/direct": through.p50_ms / straight.p50_ms}),
        Row(metric="added by the forwarder, p50", unit="ms", ours=added,
            targets=[Target(op="<=", limit=ADDED_P50_TARGET_MS)]),
        Row(metric="chat round trip p99, in-sandbox through the forwarder", unit="ms", ours=through.p99_ms,
            peers={"host → gateway directly": straight.p99_ms}),
        Row(metric="1 KiB echo round trip p50 through the forwarder alone", unit="µs", ours=relay.p50_ms * 1000,
            peers={"straight to the Unix socket": socket_only.p50_ms * 1000},
            ratios={"forwarder/socket": relay.p50_ms / socket_only.p50_ms}),
    ], latencies={"forwarder": through, "direct": straight, "relay": relay, "socket": socket_only}, notes=[
        "The model is the scripted server (no delay) behind the gateway, so a round trip is almost all "
        "gateway (FastAPI + litellm): what the forwarder adds stands out against it rather than against a "
        "real model's seconds.",
        "Inside, the path is client → 127.0.0.1:4000 in the sandbox's empty network namespace → the agent's "
        "relay threads → the gateway's Unix socket bound into the sandbox; directly, client → the gateway's "
        "TCP port on the host's loopback. Each block is one client process with a keep-alive connection.",
        "The echo row isolates the relay: the agent's Forwarder in this process (no sandbox) in front of a "
        "Unix-socket echo server, one kept connection, 1 KiB each way per round trip, against the same "
        "client on the echo server's socket directly.",
    ])


def _relay_alone(ctx: BenchContext):
    """(through the forwarder, straight to the socket): 1 KiB echo round trips on kept connections."""
    import socket
    import threading

    from orchard.sandbox.agent.forward import Forwarder

    payload = b"x" * 1024
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as directory:
        path = str(Path(directory) / "echo.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(8)

        def echo(conn: socket.socket) -> None:
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

        def accept() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                threading.Thread(target=echo, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        forwarder = Forwarder(f"unix:{path}", port=0)
        forwarder.start()
        relayed = socket.create_connection(("127.0.0.1", forwarder.port))
        relayed.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        straight = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        straight.connect(path)

        try:
            stats = measure_interleaved({"relay": echo_round_trips(relayed, payload),
                                         "socket": echo_round_trips(straight, payload)},
                                        warmup=100, runs=ctx.pick(20000, 2000), rounds=ctx.pick(20, 4))
        finally:
            relayed.close()
            straight.close()
            forwarder.close()
            server.close()
    return stats["relay"], stats["socket"]


MEASUREMENT = Measurement(
    name="model_network",
    title="Model-only networking: chat round trip through the in-sandbox forwarder",
    method=("A local sandbox with `network.mode = \"model\"` makes chat calls (stdlib `http.client`, one "
            "keep-alive connection, one call at a time) to `http://127.0.0.1:4000/r/<key>/v1` with its "
            "rollout's key; the same client on the host calls the gateway's TCP port directly. Blocks of "
            "calls alternate between the two over several rounds; each block's first calls are untimed."),
    run=run,
)
