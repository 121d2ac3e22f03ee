"""The driver of a real ZeroClaw run, inside the task's sandbox (the standard library only: it runs on the
harness bundle's Python, whatever the task image has). Given its run file (run.json, written by the adapter):

1. asks the binary its version (`zeroclaw --version`);
2. starts the recording relay: an HTTP server on loopback that passes every model call of ZeroClaw's `custom`
   provider to the Orchard gateway byte for byte and notes, per call, the response's id and what the model
   said (calls.jsonl): ZeroClaw's frames carry no response ids, and these let each step name its call;
3. writes ZeroClaw's config.toml (the relay's port filled in) and starts `zeroclaw gateway start` on a free
   loopback port, with ZEROCLAW_CONFIG_DIR and ZEROCLAW_DATA_DIR in its state directory, and waits for
   `/health`;
4. opens `/ws/chat` (subprotocol `zeroclaw.v1`, the agent alias and the task's workdir as the session's cwd),
   sends the task as `{"type": "message", "content": ...}` and records every frame that comes back
   (frames.jsonl, with the number of model calls finished when it came); answers each `approval_request`
   with the run's policy (`approve`, `always` or `deny`) and records the answer it sent;
5. stops at `done`, `error` or `aborted`, when the chat closes, or a margin before its time limit; then ends
   the gateway and everything it started (the driver is their subreaper, so nothing escapes), stops the
   relay and writes result.json: how it ended, why, the version, the gateway's exit code and log tail, the
   command lines it stopped besides the gateway and those left running (none).

It never exits without result.json unless it is killed outright. It is one file on purpose: the adapter copies
it into the sandbox as it is, beside nothing else of this distribution."""

import base64
import ctypes
import hashlib
import http.client
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, urlsplit

STOP_MARGIN_S = 3.0  # stop this long before the time limit: the kill and result.json come first
HEALTH_POLL_S = 0.2
KILL_WAIT_S = 3.0
MAX_MESSAGE = 64 << 20
LOG_TAIL = 4000
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PR_SET_CHILD_SUBREAPER = 36
TIMEOUT = object()


class Stop(Exception):
    """The run ends here: `ending` and `error` go into result.json."""

    def __init__(self, ending, error=None, code=None):
        Exception.__init__(self, error or ending)
        self.ending, self.error, self.code = ending, error, code


# --- the chat WebSocket (RFC 6455, client side) --------------------------------------------------------

class WebSocket:
    def __init__(self, sock, buffered):
        self.sock, self.buf = sock, bytearray(buffered)

    @classmethod
    def connect(cls, port, path, protocol, timeout):
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n\r\n"
                   % (path, port, key, protocol))
        sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                raise Stop("closed", "the gateway closed the connection during the WebSocket handshake")
            head += chunk
            if len(head) > 1 << 20:
                raise Stop("closed", "the gateway's answer to the WebSocket handshake has no end")
        header, rest = head.split(b"\r\n\r\n", 1)
        lines = header.decode("latin-1").split("\r\n")
        if " 101 " not in lines[0] + " ":
            body = rest.decode("utf-8", "replace")[:500]
            raise Stop("start_failed", "the gateway refused /ws/chat: %s %s" % (lines[0], body))
        fields = dict((line.split(":", 1)[0].strip().lower(), line.split(":", 1)[1].strip())
                      for line in lines[1:] if ":" in line)
        expected = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        if fields.get("sec-websocket-accept") != expected:
            raise Stop("start_failed", "the gateway's WebSocket handshake has a wrong Sec-WebSocket-Accept")
        sock.settimeout(None)
        return cls(sock, rest)

    def send_text(self, text):
        self._send(0x1, text.encode())

    def _send(self, opcode, payload):
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _frame(self):
        """One whole frame from the buffer (fin, opcode, payload), or None when it is not all there yet."""
        buf = self.buf
        if len(buf) < 2:
            return None
        fin, opcode = buf[0] & 0x80, buf[0] & 0x0F
        masked, size, at = buf[1] & 0x80, buf[1] & 0x7F, 2
        if size == 126:
            if len(buf) < 4:
                return None
            size, at = struct.unpack("!H", bytes(buf[2:4]))[0], 4
        elif size == 127:
            if len(buf) < 10:
                return None
            size, at = struct.unpack("!Q", bytes(buf[2:10]))[0], 10
        if size > MAX_MESSAGE:
            raise Stop("closed", "the gateway sent a frame of %d bytes, more than %d" % (size, MAX_MESSAGE))
        mask = b""
        if masked:
            mask, at = bytes(buf[at:at + 4]), at + 4
        if len(buf) < at + size:
            return None
        payload = bytes(buf[at:at + size])
        del buf[:at + size]
        if masked:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return fin, opcode, payload

    def receive(self, timeout):
        """The next text message (str), None once the gateway closed the chat, or TIMEOUT."""
        end = time.monotonic() + timeout
        parts, kind = [], None
        while True:
            frame = self._frame()
            if frame is None:
                left = end - time.monotonic()
                if left <= 0:
                    return TIMEOUT
                ready, _, _ = select.select([self.sock], [], [], min(left, 0.5))
                if not ready:
                    continue
                try:
                    chunk = self.sock.recv(1 << 16)
                except OSError:
                    return None
                if not chunk:
                    return None
                self.buf.extend(chunk)
                continue
            fin, opcode, payload = frame
            if opcode == 0x8:
                return None
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            if opcode in (0x1, 0x2):
                parts, kind = [payload], opcode
            elif opcode == 0x0 and kind is not None:
                parts.append(payload)
            if fin and kind is not None:
                return b"".join(parts).decode("utf-8", "replace")

    def close(self):
        try:
            self._send(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


# --- the recording relay --------------------------------------------------------------------------------

class Relay:
    """Passes ZeroClaw's model calls to the Orchard gateway as they are, recording each one (calls.jsonl)."""

    def __init__(self, upstream, path):
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path, self.lock, self.done, self.started = path, threading.Lock(), 0, 0
        self.conversations = {}
        self.server = None

    def start(self):
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                relay.forward(self, b"")

            def do_POST(self):
                size = int(self.headers.get("Content-Length") or 0)
                relay.forward(self, self.rfile.read(size) if size else b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def forward(self, handler, body):
        is_chat = handler.command == "POST" and handler.path.rstrip("/").endswith("/chat/completions")
        with self.lock:
            self.started += 1
            seq = self.started
        started = time.time()
        headers = dict((k, v) for k, v in handler.headers.items()
                       if k.lower() not in ("host", "content-length", "connection", "accept-encoding"))
        status, reason, answer, content_type = 502, "Bad Gateway", b"", "application/json"
        error = None
        try:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=900)
            connection.request(handler.command, handler.path, body=body or None, headers=headers)
            response = connection.getresponse()
            status, reason, answer = response.status, response.reason, response.read()
            content_type = response.getheader("Content-Type") or content_type
            connection.close()
        except (OSError, http.client.HTTPException) as exc:
            error = "the relay could not reach the Orchard gateway at %s:%d: %s" % (self.host, self.port, exc)
            answer = json.dumps({"error": "model_unreachable", "message": error}).encode()
        try:
            handler.send_response(status, reason)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)
        except OSError:
            pass
        if is_chat:
            self.record(seq, started, body, status, answer, error)

    def record(self, seq, started, body, status, answer, error):
        try:
            request = json.loads(body.decode("utf-8"))
        except ValueError:
            request = {}
        messages = request.get("messages") if isinstance(request.get("messages"), list) else []
        key = hashlib.sha1(json.dumps(messages[:2], sort_keys=True).encode()).hexdigest()[:16]
        record = {"seq": seq, "started": started, "ended": time.time(), "conversation": key,
                  "stream": bool(request.get("stream")), "status": status}
        with self.lock:
            previous = self.conversations.get(key)
            if previous is not None and messages[:len(previous)] == previous:
                record["extends"], record["messages"] = True, messages[len(previous):]
            else:
                record["extends"], record["messages"] = False, messages
                record["tools"] = request.get("tools") or []
            self.conversations[key] = messages
        text = answer.decode("utf-8", "replace")
        if status >= 400 or error:
            record["error"] = error or text[:2000]
        else:
            record.update(parse_answer(text, record["stream"]))
        with self.lock:
            self.done += 1
            record["done"] = self.done
            with open(self.path, "a") as out:
                out.write(json.dumps(record) + "\n")

    def finished(self):
        with self.lock:
            return self.done


def parse_answer(text, stream):
    """The response's id, message (content, reasoning, tool calls with their arguments' text), finish reason
    and usage, from a chat.completion body or its server-sent events."""
    if not stream:
        try:
            body = json.loads(text)
            choice = (body.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            calls = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
                      "arguments": (c.get("function") or {}).get("arguments")}
                     for c in message.get("tool_calls") or []]
            return {"response_id": body.get("id"), "finish_reason": choice.get("finish_reason"),
                    "usage": body.get("usage"), "message": {"content": message.get("content"),
                                                            "reasoning_content": message.get("reasoning_content"),
                                                            "tool_calls": calls}}
        except (ValueError, AttributeError, IndexError):
            return {"unparsed": text[:2000]}
    response_id, finish, usage, content, reasoning, calls = None, None, None, [], [], {}
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        response_id = response_id or chunk.get("id")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            if delta.get("reasoning_content"):
                reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call.get("index", len(calls)), {"id": None, "name": None, "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["name"] = function.get("name") or slot["name"]
                slot["arguments"] += function.get("arguments") or ""
    return {"response_id": response_id, "finish_reason": finish, "usage": usage,
            "message": {"content": "".join(content) or None, "reasoning_content": "".join(reasoning) or None,
                        "tool_calls": [calls[index] for index in sorted(calls)]}}


# --- processes ----------------------------------------------------------------------------------------

def become_subreaper():
    """Orphans of what the gateway starts are re-parented to the driver, so its end finds and ends them."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(root):
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def command_line(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def end_everything(gateway):
    """SIGTERM to the gateway, then SIGKILL to whatever of the driver's descendants is left. What it stopped
    besides the gateway (command lines), and what is left (none, unless a process could not be killed)."""
    stopped = sorted(set(filter(None, (command_line(pid) for pid in descendants(os.getpid())
                                       if gateway is None or pid != gateway.pid))))
    if gateway is not None and gateway.poll() is None:
        try:
            gateway.terminate()
            gateway.wait(KILL_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
    for _ in range(5):
        left = descendants(os.getpid())
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
        reap()
    if gateway is not None:
        try:
            gateway.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    reap()
    return stopped, [command_line(pid) or str(pid) for pid in descendants(os.getpid())]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tail(path, size=LOG_TAIL):
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - size))
            return log.read().decode("utf-8", "replace")
    except OSError:
        return ""


# --- the run ------------------------------------------------------------------------------------------

class Driver:
    def __init__(self, run):
        self.run = run
        self.state = run["state_dir"]
        self.frames_path = os.path.join(self.state, "frames.jsonl")
        self.log_path = os.path.join(self.state, "gateway.log")
        self.started = time.monotonic()
        limit = run.get("time_limit_s")
        self.stop_at = None if limit is None else self.started + max(limit / 2, limit - STOP_MARGIN_S)
        self.relay = Relay(run["upstream"], os.path.join(self.state, "calls.jsonl"))
        self.gateway, self.chat, self.frames = None, None, 0
        self.result = {"ending": None, "error": None, "code": None, "version": None, "session_id": None}

    def left(self):
        return None if self.stop_at is None else self.stop_at - time.monotonic()

    def log(self, direction, text):
        try:
            frame = json.loads(text)
            entry = {"frame": frame} if isinstance(frame, dict) else {"raw": text}
        except ValueError:
            entry = {"raw": text}
        self.frames += 1
        entry.update({"seq": self.frames, "dir": direction, "calls": self.relay.finished(),
                      "t": round(time.monotonic() - self.started, 3)})
        with open(self.frames_path, "a") as out:
            out.write(json.dumps(entry) + "\n")
        return entry.get("frame")

    def version(self):
        try:
            done = subprocess.run(self.run["zeroclaw"] + ["--version"], capture_output=True, timeout=30,
                                  cwd=self.run["workdir"])
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Stop("start_failed", "cannot run %s: %s" % (self.run["zeroclaw"][0], exc))
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode("utf-8", "replace")[-500:]
            raise Stop("start_failed", "`%s --version` exited with code %d: %s" % (
                self.run["zeroclaw"][0], done.returncode, said))
        return done.stdout.decode("utf-8", "replace").strip()

    def start_gateway(self, relay_port):
        config_dir = self.run["config_dir"]
        os.makedirs(config_dir, exist_ok=True)
        path = os.path.join(config_dir, "config.toml")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as config:
            config.write(self.run["config"].replace("@RELAY_PORT@", str(relay_port)))
        port = free_port()
        env = dict(os.environ)
        env.update({"ZEROCLAW_CONFIG_DIR": config_dir, "ZEROCLAW_DATA_DIR": os.path.join(self.state, "data"),
                    "NO_COLOR": "1"})
        log = open(self.log_path, "ab")
        try:
            self.gateway = subprocess.Popen(
                self.run["zeroclaw"] + ["gateway", "start", "--host", "127.0.0.1", "--port", str(port)],
                cwd=self.run["workdir"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise Stop("start_failed", "cannot start %s: %s" % (self.run["zeroclaw"][0], exc))
        finally:
            log.close()
        give_up = time.monotonic() + self.run.get("health_timeout_s", 60)
        while True:
            code = self.gateway.poll()
            if code is not None:
                raise Stop("start_failed", "ZeroClaw's gateway exited with code %d before it answered /health" % code)
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                connection.request("GET", "/health")
                if connection.getresponse().status == 200:
                    connection.close()
                    return port
                connection.close()
            except (OSError, http.client.HTTPException):
                pass
            now = time.monotonic()
            if now > give_up or (self.stop_at is not None and now > self.stop_at):
                raise Stop("start_failed", "ZeroClaw's gateway did not answer /health on port %d within %d s"
                           % (port, self.run.get("health_timeout_s", 60)))
            time.sleep(HEALTH_POLL_S)

    def converse(self, port):
        path = "/ws/chat?agent=%s&cwd=%s" % (quote(self.run["agent"]), quote(self.run["workdir"]))
        self.chat = WebSocket.connect(port, path, "zeroclaw.v1", timeout=30)
        message = json.dumps({"type": "message", "content": self.run["message"]})
        sent = False
        policy = self.run.get("approval", "approve")
        while True:
            left = self.left()
            if left is not None and left <= 0:
                raise Stop("timeout", "ZeroClaw was still working when its time ran out")
            text = self.chat.receive(5.0 if left is None else min(left, 5.0))
            if text is TIMEOUT:
                continue
            if text is None:
                raise Stop("closed", "the gateway closed the chat before the turn ended")
            frame = self.log("in", text) or {}
            kind = frame.get("type")
            if kind == "session_start":
                self.result["session_id"] = frame.get("session_id")
            if kind in ("session_start", "connected") and not sent:
                self.chat.send_text(message)
                self.log("out", message)
                sent = True
            elif kind == "approval_request":
                answer = json.dumps({"type": "approval_response", "request_id": frame.get("request_id"),
                                     "decision": policy})
                self.chat.send_text(answer)
                self.log("out", answer)
            elif kind == "done":
                raise Stop("done")
            elif kind == "aborted":
                raise Stop("aborted", "the gateway aborted the turn")
            elif kind == "error":
                raise Stop("error", frame.get("message") or frame.get("error") or "the gateway reported an error",
                           frame.get("code"))

    def main(self):
        become_subreaper()
        signal.signal(signal.SIGTERM, self._stopped)
        signal.signal(signal.SIGINT, self._stopped)
        try:
            self.result["version"] = self.version()
            relay_port = self.relay.start()
            port = self.start_gateway(relay_port)
            self.converse(port)
        except Stop as stop:
            self.result.update(ending=stop.ending, error=stop.error, code=stop.code)
        finally:
            if self.chat is not None:
                self.chat.close()
            self.result["stopped"], self.result["left_running"] = end_everything(self.gateway)
            self.relay.stop()
            self.result["gateway_exit"] = None if self.gateway is None else self.gateway.returncode
            self.result["gateway_log_tail"] = tail(self.log_path)
            self.result["duration_s"] = round(time.monotonic() - self.started, 3)
            with open(os.path.join(self.state, "result.json"), "w") as out:
                json.dump(self.result, out)
        return 0

    def _stopped(self, signum, frame):
        raise Stop("timeout", "the driver was stopped (signal %d) while ZeroClaw worked" % signum)


if __name__ == "__main__":
    with open(sys.argv[1]) as run_file:
        sys.exit(Driver(json.load(run_file)).main())
