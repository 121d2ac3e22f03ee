#!/usr/bin/env python3
"""mcp-call: a task's MCP tools from a shell, for harnesses whose only tool is bash (mini-swe-agent).

    mcp-call --list                      every server's tools: name, description, arguments (JSON Schema)
    mcp-call SERVER TOOL '{"arg": 1}'    call a tool; prints its result (text; other content described)

The servers come from ORCHARD_MCP_SERVERS, a JSON object of name -> {"url": ...} (streamable HTTP) or
{"command": ..., "args": [...], "env": {...}} (stdio: started for the call), the `mcpServers` shape of
MCP clients. Standard library only: it runs on the image's python3 whatever is installed there. Exit
status: 0 done, 1 the tool reported an error, 2 usage or connection errors (with a message on stderr)."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

PROTOCOL_VERSION = "2025-06-18"
TIMEOUT_S = float(os.environ.get("ORCHARD_MCP_TIMEOUT_S", "120"))


class CallError(Exception):
    pass


class HttpServer:
    """Streamable HTTP: each JSON-RPC message is a POST; the answer is JSON or a server-sent event stream."""

    def __init__(self, url):
        self.url, self.session, self.version = url, None, None

    def request(self, message):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        if self.version:
            headers["MCP-Protocol-Version"] = self.version
        req = urllib.request.Request(self.url, json.dumps(message).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                self.session = resp.headers.get("Mcp-Session-Id") or self.session
                if "id" not in message:
                    return None
                body = resp.read().decode("utf-8", "replace")
                kind = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raise CallError("%s answered %d: %s" % (self.url, exc.code, exc.read()[:300].decode("utf-8", "replace")))
        except (urllib.error.URLError, OSError) as exc:
            raise CallError("cannot reach the MCP server at %s: %s" % (self.url, getattr(exc, "reason", exc)))
        if "text/event-stream" in kind:
            for line in body.splitlines():
                if line.startswith("data:"):
                    answer = json.loads(line[5:].strip())
                    if answer.get("id") == message["id"]:
                        return answer
            raise CallError("%s sent no answer to %s" % (self.url, message["method"]))
        return json.loads(body)

    def close(self):
        pass


class StdioServer:
    """stdio: newline-delimited JSON-RPC on the started command's stdin and stdout."""

    def __init__(self, spec):
        env = dict(os.environ, **spec.get("env", {}))
        self.proc = subprocess.Popen([spec["command"]] + list(spec.get("args", [])), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def request(self, message):
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise CallError("the MCP server's command ended: %s" % exc)
        if "id" not in message:
            return None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise CallError("the MCP server's command ended before answering %s" % message["method"])
            answer = json.loads(line)
            if answer.get("id") == message["id"]:
                return answer

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Session:
    def __init__(self, name, spec):
        self.name = name
        self.server = HttpServer(spec["url"]) if "url" in spec else StdioServer(spec)
        self.next_id = 0
        init = self.call("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                        "clientInfo": {"name": "mcp-call", "version": "1"}})
        if isinstance(self.server, HttpServer):
            self.server.version = init.get("protocolVersion", PROTOCOL_VERSION)
        self.server.request({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, method, params):
        self.next_id += 1
        answer = self.server.request({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        if "error" in answer:
            raise CallError("%s: %s failed: %s" % (self.name, method, answer["error"].get("message", answer["error"])))
        return answer.get("result", {})


def describe(content):
    kind = content.get("type")
    if kind == "text":
        return content.get("text", "")
    if kind == "image":
        return "[image: %s, %d bytes base64]" % (content.get("mimeType", "?"), len(content.get("data", "")))
    if kind == "resource":
        resource = content.get("resource", {})
        return resource.get("text") or "[resource %s]" % resource.get("uri", "")
    return json.dumps(content)


def main(argv):
    try:
        servers = json.loads(os.environ.get("ORCHARD_MCP_SERVERS") or "{}")
    except ValueError:
        servers = None
    if not isinstance(servers, dict) or not servers:
        sys.stderr.write("mcp-call: no MCP servers: ORCHARD_MCP_SERVERS must be a JSON object of name -> "
                         "{\"url\": ...} or {\"command\": ..., \"args\": [...]}\n")
        return 2
    if argv[:1] == ["--list"] and len(argv) == 1:
        for name, spec in sorted(servers.items()):
            session = Session(name, spec)
            try:
                for tool in session.call("tools/list", {}).get("tools", []):
                    print("%s %s: %s" % (name, tool["name"], (tool.get("description") or "").strip()))
                    print("  arguments: %s" % json.dumps(tool.get("inputSchema", {})))
            finally:
                session.server.close()
        return 0
    if len(argv) not in (2, 3) or argv[0].startswith("-"):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    name, tool = argv[0], argv[1]
    if name not in servers:
        sys.stderr.write("mcp-call: no MCP server %r; there are: %s\n" % (name, ", ".join(sorted(servers))))
        return 2
    try:
        arguments = json.loads(argv[2]) if len(argv) == 3 else {}
    except ValueError as exc:
        sys.stderr.write("mcp-call: the arguments are not JSON: %s\n" % exc)
        return 2
    if not isinstance(arguments, dict):
        sys.stderr.write("mcp-call: the arguments must be a JSON object\n")
        return 2
    session = Session(name, servers[name])
    try:
        result = session.call("tools/call", {"name": tool, "arguments": arguments})
    finally:
        session.server.close()
    print("\n".join(describe(c) for c in result.get("content", [])))
    return 1 if result.get("isError") else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except CallError as exc:
        sys.stderr.write("mcp-call: %s\n" % exc)
        sys.exit(2)
