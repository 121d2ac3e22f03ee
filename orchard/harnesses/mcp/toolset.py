"""A task's MCP tools for a harness that runs in Orchard's process (react): each tool of each server as an
OpenAI function tool named `<server>__<tool>`, called with the `mcp` SDK's client.

An http server is reached through the sandbox's port (`forward_port`), one session for the whole run. A
stdio server is started inside the sandbox for each call (`exec` with the JSON-RPC lines on its stdin, as
`mcp-call` does): it keeps no state between calls but what it writes to files or services. A result's text
goes back to the model; other content (an image, a resource) is described in a line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from typing import Any

from orchard.core.errors import OrchardError
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task, TaskMCPServer
from orchard.core.trajectory import IMAGE_TYPES

SEPARATOR = "__"
MAX_NAME = 64  # OpenAI's limit on a function's name
PROTOCOL_VERSION = "2025-06-18"
STDIO_TIMEOUT_S = 120.0
STDERR_DIR = "/tmp/.orchard-mcp"


class McpCallFailed(Exception):
    """An MCP server failed under a call (not the tool reporting an error): the message says which."""


class McpToolset:
    """`async with McpToolset(task, sandbox) as tools`: `definitions` to offer, `call(name, arguments)`."""

    def __init__(self, task: Task, sandbox: Sandbox) -> None:
        self.task, self.sandbox = task, sandbox
        self.definitions: list[dict[str, Any]] = []
        self._routes: dict[str, tuple[TaskMCPServer, str]] = {}
        self._sessions: dict[str, Any] = {}
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> McpToolset:
        try:
            for server in self.task.environment.mcp_servers:
                tools = await (self._open_http(server) if server.transport == "http" else self._stdio_tools(server))
                for tool in tools:
                    name = f"{server.name}{SEPARATOR}{tool['name']}"[:MAX_NAME]
                    self._routes[name] = (server, tool["name"])
                    self.definitions.append({"type": "function", "function": {
                        "name": name, "description": tool.get("description") or f"{tool['name']} ({server.name})",
                        "parameters": tool.get("inputSchema") or {"type": "object", "properties": {}}}})
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    def has(self, name: str) -> bool:
        return name in self._routes

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool, list[tuple[str, bytes]]]:
        """(what the model sees, whether the tool reported an error, its images as (media type, bytes) for the
        trajectory); McpCallFailed when the server failed."""
        server, tool = self._routes[name]
        if server.transport == "http":
            try:
                result = await self._sessions[server.name].call_tool(tool, arguments)
            except Exception as exc:  # noqa: BLE001 — the SDK raises many kinds; the model sees which
                raise McpCallFailed(f"MCP server {server.name} failed on {tool}: "
                                    f"{type(exc).__name__}: {exc}") from exc
            content = [part.model_dump(mode="json", by_alias=True) for part in result.content]
            return render(content), bool(result.is_error), images(content)
        answer = await self._sessions[server.name].call_tool(tool, arguments)
        content = answer.get("content", [])
        return render(content), bool(answer.get("isError")), images(content)

    async def _open_http(self, server: TaskMCPServer) -> list[dict[str, Any]]:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        forward = self.sandbox.forward_port(server.port)
        self._stack.callback(forward.close)
        streams = await self._stack.enter_async_context(streamable_http_client(forward.url("http", server.path)))
        session = await self._stack.enter_async_context(ClientSession(streams[0], streams[1]))
        try:
            await session.initialize()
            listed = await session.list_tools()
        except Exception as exc:  # noqa: BLE001
            raise McpCallFailed(f"MCP server {server.name} did not list its tools: "
                                f"{type(exc).__name__}: {exc}") from exc
        self._sessions[server.name] = session
        return [{"name": t.name, "description": t.description, "inputSchema": t.input_schema} for t in listed.tools]

    async def _stdio_tools(self, server: TaskMCPServer) -> list[dict[str, Any]]:
        session = StdioSession(server)
        await session.open(self.sandbox)
        self._stack.push_async_callback(session.close)
        self._sessions[server.name] = session
        return (await session.request("tools/list", {})).get("tools", [])


class StdioSession:
    """JSON-RPC, one message a line, with an MCP server started in the sandbox (its stdin and stdout)."""

    def __init__(self, server: TaskMCPServer) -> None:
        self.server = server
        self.next_id = 0
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        # Its stderr goes to a file, read back to say why should it end: stdout is the protocol's.
        self.stderr_path = f"{STDERR_DIR}/{self.server.name}.stderr"
        started = f'mkdir -p {STDERR_DIR} && exec 2>>{self.stderr_path}; {self.server.command}'
        try:
            self.reader, self.writer = await sandbox.attach(["/bin/sh", "-c", started], env=self.server.env or None)
        except OrchardError as exc:
            raise McpCallFailed(f"MCP server {self.server.name} could not be started: {exc}") from exc
        await self.request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                          "clientInfo": {"name": "orchard", "version": "1"}})
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        await self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            try:
                line = await asyncio.wait_for(self.reader.readline(), timeout=STDIO_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as exc:
                raise McpCallFailed(f"MCP server {self.server.name} (stdio) did not answer {method}: "
                                    f"{exc or type(exc).__name__}") from exc
            if not line:
                raise McpCallFailed(f"MCP server {self.server.name} (stdio) ended before answering {method}"
                                    f"{await self._stderr_tail()}")
            with contextlib.suppress(ValueError):
                answer = json.loads(line)
                if isinstance(answer, dict) and answer.get("id") == self.next_id:
                    if "error" in answer:
                        raise McpCallFailed(f"MCP server {self.server.name}: {method} failed: "
                                            f"{answer['error'].get('message', answer['error'])}")
                    return answer.get("result", {})

    async def _stderr_tail(self) -> str:
        try:
            text = (await self.sandbox.read_file(self.stderr_path, max_bytes=1 << 20)).decode("utf-8", "replace")
        except OrchardError:
            return ""
        return f"; its stderr ends: {text.strip()[-500:]}" if text.strip() else ""

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": tool, "arguments": arguments})

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            self.writer.write(json.dumps(message).encode() + b"\n")
            await self.writer.drain()
        except OSError as exc:
            raise McpCallFailed(f"MCP server {self.server.name} (stdio) is gone: {exc}") from exc

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()


def images(content: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """A result's images of the kinds a trajectory keeps (ATIF: jpeg, png, gif, webp), decoded."""
    found = []
    for part in content:
        media_type = part.get("mimeType") or part.get("mime_type")
        if part.get("type") == "image" and media_type in IMAGE_TYPES:
            with contextlib.suppress(ValueError, TypeError):
                found.append((media_type, base64.b64decode(part.get("data", ""), validate=True)))
    return found


def render(content: list[dict[str, Any]]) -> str:
    """A tool result's content as the text a model reads."""
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append(part.get("text", ""))
        elif kind == "image":
            parts.append(f"[image: {part.get('mimeType') or part.get('mime_type', '?')}, "
                         f"{len(part.get('data', ''))} bytes base64]")
        elif kind == "resource":
            resource = part.get("resource", {})
            parts.append(resource.get("text") or f"[resource {resource.get('uri', '')}]")
        else:
            parts.append(json.dumps(part))
    return "\n".join(parts)
