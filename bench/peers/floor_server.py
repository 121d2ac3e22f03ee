"""The floor for an exec agent: the least a keep-alive HTTP server can do to run a command.

Standard library only: `http.server.ThreadingHTTPServer`, HTTP/1.1 keep-alive, TCP_NODELAY, and one
`write` per response (headers and body together — two writes without TCP_NODELAY cost ~40 ms per request
from Nagle + delayed ACK). A command runs the way Orchard's agent runs it: a string under `/bin/sh -c`, a
list as argv, stdout and stderr captured.

    python -m bench.peers.floor_server --port 0     # prints "READY <port>" once listening

Endpoints: `GET /health` → `{"status": "ok", "pid": N}`; `POST /exec` with `{"command": ...}` →
`{"exit_code", "stdout", "stderr", "duration_s"}`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FloorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(HTTPStatus.OK, {"status": "ok", "pid": os.getpid()})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": "not_found", "message": f"no route {self.path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path != "/exec":
            self._reply(HTTPStatus.NOT_FOUND, {"error": "not_found", "message": f"no route {self.path}"})
            return
        try:
            command = json.loads(body)["command"]
        except (ValueError, KeyError, TypeError):
            self._reply(HTTPStatus.BAD_REQUEST,
                        {"error": "invalid_request", "message": 'send JSON {"command": "..."}'})
            return
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else command
        started = time.perf_counter()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
        self._reply(HTTPStatus.OK, {
            "exit_code": proc.returncode,
            "stdout": proc.stdout.decode(errors="replace"),
            "stderr": proc.stderr.decode(errors="replace"),
            "duration_s": time.perf_counter() - started,
        })

    def _reply(self, status: HTTPStatus, payload: dict) -> None:
        body = json.dumps(payload).encode()
        head = (f"HTTP/1.1 {status.value} {status.phrase}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.wfile.write(head + body)  # one write: headers and body leave in one segment

    def log_message(self, format: str, *args: object) -> None:
        """Silent: logging every request is not part of the floor."""


class FloorServer(ThreadingHTTPServer):
    daemon_threads = True
    # The stdlib default backlog of 5 makes bursts of new connections fail (resets) under concurrent load.
    request_queue_size = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()
    server = FloorServer((args.host, args.port), FloorHandler)
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
