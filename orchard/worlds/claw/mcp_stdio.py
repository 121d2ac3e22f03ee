"""A Claw service's tools over MCP (stdio transport: one JSON-RPC message a line), relaying each tool call
to the service's HTTP API. It holds no state: the service is the source of truth and audits the call (as
`via: mcp`). Standard library only, so it starts in a few tens of milliseconds wherever a client starts it
(react once per run, mcp-call once per call, kimi-cli and OpenHands from their MCP config).

A call the service refuses or fails (4xx, 5xx: an injected 429 included) is the tool's error result
(`isError`), its text saying the status and what to do: the agent sees it and may retry. A service that
cannot be reached at all is a JSON-RPC error: the environment broke, not the agent."""

from __future__ import annotations

import json
import sys

from .http_client import VIA_HEADER, HttpError, request

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
TIMEOUT_S = 120


class Unreachable(Exception):
    pass


class Relay:
    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url.rstrip("/")
        self.tools = None

    def _http(self, method: str, path: str, body: dict | None = None):
        try:
            return request(self.url + path, method, body, {VIA_HEADER: "mcp"}, timeout=TIMEOUT_S)
        except HttpError as exc:
            raise Unreachable(f"the {self.name} service at {self.url} cannot be reached: {exc}") from None

    def handle(self, message: dict):
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {"protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0],
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": f"claw-{self.name}", "version": "1"},
                    "instructions": f"The user's {self.name} service."}
        if method == "ping":
            return {}
        if method == "tools/list":
            if self.tools is None:
                status, answer = self._http("GET", "/tools")
                if status != 200:
                    raise Unreachable(f"the {self.name} service did not list its tools ({status})")
                self.tools = answer["tools"]
            return {"tools": self.tools}
        if method == "tools/call":
            status, answer = self._http("POST", "/" + str(params.get("name", "")), params.get("arguments") or {})
            if status == 200:
                return {"content": [{"type": "text", "text": json.dumps(answer, indent=1)}], "isError": False}
            error = answer.get("error") if isinstance(answer, dict) else answer
            return {"content": [{"type": "text", "text": f"error {status}: {error}"}], "isError": True}
        raise LookupError(method)


def run(name: str, url: str, stdin=None, stdout=None, relay: Relay | None = None) -> int:
    """Serve MCP on stdin/stdout with `relay` (default: the Claw service at `url`'s)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    relay = relay or Relay(name, url)
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except ValueError:
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "not JSON"}}
            stdout.write(json.dumps(reply) + "\n")
            stdout.flush()
            continue
        if not isinstance(message, dict) or "id" not in message:
            continue  # a notification (initialized, cancelled): nothing to answer
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        try:
            reply["result"] = relay.handle(message)
        except LookupError as exc:
            reply["error"] = {"code": -32601, "message": f"no method {exc}"}
        except Unreachable as exc:
            reply["error"] = {"code": -32000, "message": str(exc)}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()
    return 0
