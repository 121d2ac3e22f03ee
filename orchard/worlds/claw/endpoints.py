"""Tools a task declares, each mapped to an HTTP endpoint (Claw-Eval's `tools` + `tool_endpoints`), over
MCP (stdio): the Claw services' relay (mcp_stdio.py), except that the tools are the task's own list, not
the service's `/tools`, and each call goes to its tool's endpoint — a POST with the call's arguments as its
JSON body (GET: as the query string). Like that relay it keeps no state: the service audits the call.

The tool list comes base64-encoded on the command line (`run.py mcp-endpoints NAME TOOLS`): nothing to place
in the sandbox, nothing the agent could edit. Standard library only."""

from __future__ import annotations

import base64
import json

from .http_client import VIA_HEADER, HttpError, request
from .mcp_stdio import Relay, Unreachable
from .mcp_stdio import run as run_relay

TIMEOUT_S = 120


def encode_tools(tools: list) -> str:
    """The argument `mcp-endpoints` takes: [{name, description, inputSchema, url, method}, ...]."""
    return base64.b64encode(json.dumps(tools, separators=(",", ":")).encode()).decode("ascii")


def _query(arguments: dict) -> str:
    from urllib.parse import urlencode  # only GET tools pay its import

    return urlencode({k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()})


class EndpointRelay(Relay):
    def __init__(self, name: str, tools: list) -> None:
        super().__init__(name, "")
        self.endpoints = {tool["name"]: tool for tool in tools}
        self.tools = [{"name": t["name"], "description": t.get("description", ""),
                       "inputSchema": t.get("inputSchema") or {"type": "object", "properties": {}}} for t in tools]

    def handle(self, message: dict):
        if message.get("method") != "tools/call":
            return super().handle(message)  # initialize, ping, tools/list (self.tools is set)
        params = message.get("params") or {}
        name, arguments = str(params.get("name", "")), params.get("arguments") or {}
        tool = self.endpoints.get(name)
        if tool is None:
            return {"content": [{"type": "text", "text": f"no tool {name!r}; the tools: "
                                 f"{', '.join(self.endpoints)}"}], "isError": True}
        url, method = tool["url"], tool.get("method", "POST")
        body = arguments
        if method == "GET":
            url, body = (f"{url}?{_query(arguments)}" if arguments else url), None
        try:
            status, answer = request(url, method, body, {VIA_HEADER: "mcp"}, timeout=TIMEOUT_S)
        except HttpError as exc:
            raise Unreachable(f"the {self.name} service cannot be reached at {url}: {exc}") from None
        if 200 <= status < 300:
            return {"content": [{"type": "text", "text": json.dumps(answer, indent=1, ensure_ascii=False)}],
                    "isError": False}
        error = answer.get("error") or answer.get("detail") if isinstance(answer, dict) else answer
        return {"content": [{"type": "text", "text": f"error {status}: {error}"}], "isError": True}


def run(name: str, encoded: str, stdin=None, stdout=None) -> int:
    tools = json.loads(base64.b64decode(encoded))
    return run_relay(name, "", stdin, stdout, relay=EndpointRelay(name, tools))
