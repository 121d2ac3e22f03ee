#!/usr/bin/env python3
"""A STAND-IN for the ZeroClaw binary, for the tests of the adapter's real-binary path: ZeroClaw itself (Rust,
1267 crates, against Debian's rustc 1.63 and no crates.io) cannot be built or fetched on these machines. It
is not ZeroClaw. It speaks ZeroClaw 0.8.4's gateway as its sources and the PyPI client `zeroclaw-api-client`
document it, with a small agent loop of its own behind it, so the adapter's driver, config, frame reading and
ending rules run against a real process and a real WebSocket:

    zeroclaw --version                                   "zeroclaw-standin 0.8.4 (...)"
    zeroclaw gateway start --host H --port P             reads $ZEROCLAW_CONFIG_DIR/config.toml

`GET /health`; `GET /ws/chat?agent=A&cwd=DIR` (subprotocol `zeroclaw.v1`): `session_start`, then for the first
`{"type": "message"}` one turn of its loop: model calls to the `custom` provider's `uri` (chat completions,
with `api_key`), a `shell` tool (and `delegate`, a sub-agent with the shell only, whose calls send no frames,
as ZeroClaw's do not), frames `chunk`, `tool_call`, `tool_result`, `approval_request` before each shell command
when the risk profile's level is `supervised` (waiting for `approval_response`), `history_trimmed` when the
history passes `max_history_messages` (the task kept, the breadcrumb, the newest messages kept), and `done`
or `error` (`PROVIDER_ERROR` when a model call fails). It stops after `max_tool_iterations` model calls.

Misbehaviour on demand, for the tests of bad input (`ZEROCLAW_STANDIN`, comma-separated): `odd-frames` sends a
frame of a type ZeroClaw does not have and a frame that is not JSON during the turn; `crash` exits with
code 3 before listening; `close-early` closes the chat after the first tool result, without `done`."""

import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit

VERSION = "zeroclaw-standin 0.8.4 (Orchard's test stand-in for the ZeroClaw gateway, not ZeroClaw)"
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
BREADCRUMB = "[earlier turns omitted to fit the context window]"
FLAGS = set(filter(None, os.environ.get("ZEROCLAW_STANDIN", "").split(",")))
SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Execute a shell command in the workspace directory",
    "parameters": {"type": "object", "properties": {"command": {"type": "string",
                                                                "description": "The shell command to execute"}},
                   "required": ["command"]}}}
DELEGATE = {"type": "function", "function": {
    "name": "delegate", "description": "Delegate a subtask to a specialized agent.",
    "parameters": {"type": "object", "properties": {"agent": {"type": "string"}, "prompt": {"type": "string"}},
                   "required": ["agent", "prompt"]}}}


class ChatClosed(Exception):
    pass


class Socket:
    """The server side of one WebSocket."""

    def __init__(self, conn, rest):
        self.conn, self.buf = conn, bytearray(rest)

    def _read(self, size):
        while len(self.buf) < size:
            chunk = self.conn.recv(65536)
            if not chunk:
                raise ChatClosed()
            self.buf.extend(chunk)
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    def receive(self):
        while True:
            first, second = self._read(2)
            opcode, size = first & 0x0F, second & 0x7F
            if size == 126:
                size = struct.unpack("!H", self._read(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self._read(size)))
            if opcode == 0x8:
                raise ChatClosed()
            if opcode == 0x1:
                return payload.decode()

    def send(self, frame):
        self.send_text(json.dumps(frame))

    def send_text(self, text):
        data = text.encode()
        size = len(data)
        head = (struct.pack("!BB", 0x81, size) if size < 126 else struct.pack("!BBH", 0x81, 126, size)
                if size < 1 << 16 else struct.pack("!BBQ", 0x81, 127, size))
        self.conn.sendall(head + data)

    def close(self):
        try:
            self.conn.sendall(struct.pack("!BBH", 0x88, 2, 1000))
        except OSError:
            pass
        self.conn.close()


class Turn:
    """One turn of the stand-in's agent loop on one chat."""

    def __init__(self, config, chat, cwd):
        self.chat, self.cwd = chat, cwd
        provider = config["providers"]["models"]["custom"]["orchard"]
        self.uri, self.key, self.model = provider["uri"].rstrip("/"), provider.get("api_key"), provider["model"]
        runtime = config.get("runtime_profiles", {}).get("orchard", {})
        self.max_iterations = int(runtime.get("max_tool_iterations") or 10)
        self.max_history = int(runtime.get("max_history_messages") or 50)
        self.shell_timeout = float(runtime.get("shell_timeout_secs") or 60)
        self.supervised = config.get("risk_profiles", {}).get("orchard", {}).get("level") == "supervised"

    def complete(self, messages, tools):
        body = json.dumps({"model": self.model, "messages": messages, "tools": tools}).encode()
        request = urllib.request.Request(self.uri + "/chat/completions", data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": "Bearer %s" % self.key})
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())["choices"][0]["message"]

    def shell(self, command):
        try:
            done = subprocess.run(["sh", "-c", command], cwd=self.cwd, capture_output=True,
                                  timeout=self.shell_timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return "Error: Command timed out after %gs and was killed" % self.shell_timeout
        stdout, stderr = done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
        if done.returncode == 0:
            return stdout or "(no output)"
        return "Error: " + (stderr or stdout)

    def approved(self, tool, summary):
        request_id = "apr-%d" % id(summary)
        self.chat.send({"type": "approval_request", "request_id": request_id, "tool": tool,
                        "arguments_summary": summary, "timeout_secs": 120})
        while True:
            answer = json.loads(self.chat.receive())
            if answer.get("type") == "approval_response" and answer.get("request_id") == request_id:
                return answer.get("decision") in ("approve", "always")

    def trim(self, messages):
        body = messages[1:]
        if len(body) <= self.max_history:
            return messages
        tail = body[-(self.max_history - 2):]
        calls = {c["id"] for m in tail if m["role"] == "assistant" for c in m.get("tool_calls") or []}
        tail = [m for m in tail if m["role"] != "tool" or m["tool_call_id"] in calls]
        dropped = len(body) - 1 - len(tail)
        self.chat.send({"type": "history_trimmed", "dropped_messages": dropped, "kept_turns": 1,
                        "reason": "message limit"})
        return [messages[0], body[0], {"role": "user", "content": BREADCRUMB}, *tail]

    def run(self, content):
        messages = [{"role": "system", "content": "You are ZeroClaw's stand-in. Working directory: `%s`" % self.cwd},
                    {"role": "user", "content": content}]
        tools = [SHELL, DELEGATE]
        for iteration in range(self.max_iterations):
            messages = self.trim(messages)
            try:
                reply = self.complete(messages, tools)
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                detail = exc.read().decode("utf-8", "replace")[:300] if isinstance(exc, urllib.error.HTTPError) else exc
                self.chat.send({"type": "error", "message": "model provider error: %s" % detail,
                                "code": "PROVIDER_ERROR"})
                return
            if reply.get("content"):
                self.chat.send({"type": "chunk", "content": reply["content"]})
            calls = reply.get("tool_calls") or []
            messages.append({"role": "assistant", "content": reply.get("content"), **({"tool_calls": calls}
                                                                                       if calls else {})})
            if not calls:
                self.chat.send({"type": "done", "full_response": reply.get("content") or "", "model": self.model,
                                "provider": "custom"})
                return
            for call in calls:
                name = call["function"]["name"]
                args = json.loads(call["function"].get("arguments") or "{}")
                self.chat.send({"type": "tool_call", "id": call["id"], "name": name, "args": args})
                if "odd-frames" in FLAGS:
                    self.chat.send({"type": "weather_report", "sky": "clear", "note": "not a ZeroClaw frame"})
                    self.chat.send_text("this frame is not JSON")
                if name == "shell" and self.supervised and not self.approved("shell", args.get("command", "")):
                    output = "Error: the operator denied this call"
                elif name == "shell":
                    output = self.shell(args.get("command", ""))
                elif name == "delegate":
                    output = self.delegate(args)
                else:
                    output = "Error: Unknown tool: %s" % name
                self.chat.send({"type": "tool_result", "id": call["id"], "name": name, "output": output})
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
                if "close-early" in FLAGS:
                    raise ChatClosed()
        self.chat.send({"type": "error", "message": "Agent exceeded maximum tool iterations (%d)"
                        % self.max_iterations, "code": "AGENT_ERROR"})

    def delegate(self, args):
        messages = [{"role": "system", "content": "You are the stand-in's sub-agent `%s`." % args.get("agent")},
                    {"role": "user", "content": args.get("prompt", "")}]
        for _ in range(self.max_iterations):
            reply = self.complete(messages, [SHELL])
            calls = reply.get("tool_calls") or []
            messages.append({"role": "assistant", "content": reply.get("content"),
                             **({"tool_calls": calls} if calls else {})})
            if not calls:
                return "[Agent '%s' (custom/%s, agentic)]\n%s" % (args.get("agent"), self.model,
                                                                   reply.get("content") or "")
            for call in calls:
                command = json.loads(call["function"].get("arguments") or "{}").get("command", "")
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": self.shell(command)})
        return "Error: the sub-agent reached its iteration limit"


def serve_connection(conn, config):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(65536)
        if not chunk:
            conn.close()
            return
        head += chunk
    header, rest = head.split(b"\r\n\r\n", 1)
    lines = header.decode("latin-1").split("\r\n")
    method, target = lines[0].split(" ")[:2]
    fields = {line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1].strip() for line in lines[1:] if ":" in line}
    url = urlsplit(target)
    if method == "GET" and url.path == "/health":
        body = b'{"status":"ok"}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
        conn.close()
        return
    query = parse_qs(url.query)
    if url.path != "/ws/chat" or query.get("agent", [""])[0] not in config.get("agents", {}):
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()
        return
    accept = base64.b64encode(hashlib.sha1((fields["sec-websocket-key"] + GUID).encode()).digest()).decode()
    conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Accept: %s\r\nSec-WebSocket-Protocol: zeroclaw.v1\r\n\r\n" % accept).encode())
    chat = Socket(conn, rest)
    cwd = query.get("cwd", [os.getcwd()])[0]
    try:
        chat.send({"type": "session_start", "session_id": "standin-%d" % os.getpid(), "resumed": False,
                   "message_count": 0})
        first = json.loads(chat.receive())
        if first.get("type") != "message" or not first.get("content"):
            chat.send({"type": "error", "message": "Unsupported message type", "code": "UNKNOWN_MESSAGE_TYPE"})
            return
        Turn(config, chat, cwd).run(first["content"])
        chat.receive()  # the client closes the chat
    except ChatClosed:
        pass
    finally:
        chat.close()


def gateway(args):
    host, port = "127.0.0.1", 42617
    for flag, value in zip(args, args[1:]):
        if flag == "--host":
            host = value
        elif flag in ("--port", "-p"):
            port = int(value)
    with open(os.path.join(os.environ["ZEROCLAW_CONFIG_DIR"], "config.toml"), "rb") as source:
        config = tomllib.load(source)
    if "crash" in FLAGS:
        print("zeroclaw-standin: crashing on purpose (ZEROCLAW_STANDIN=crash)", file=sys.stderr)
        sys.exit(3)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(16)
    print("zeroclaw-standin gateway listening on %s:%d" % (host, port), flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve_connection, args=(conn, config), daemon=True).start()


if __name__ == "__main__":
    if sys.argv[1:] == ["--version"]:
        print(VERSION)
    elif sys.argv[1:3] == ["gateway", "start"]:
        gateway(sys.argv[3:])
    else:
        sys.exit("zeroclaw-standin: usage: zeroclaw --version | zeroclaw gateway start --host H --port P")
