"""`POST /exec` and `POST /exec/stream`: run one command in its own process group, feed its stdin, read
stdout and stderr together (one selector loop, no threads), keep the first `max_output_bytes` of each and
drop the rest, and on a timeout kill the whole group, grandchildren included."""

from __future__ import annotations

import codecs
import json
import os
import selectors
import signal
import subprocess
import time

from . import fields, identity, pidns, workload_cgroup
from .wire import ApiError, bad_request

EXEC_FIELDS = ("command", "cwd", "env", "stdin", "timeout", "max_output_bytes")
DEFAULT_MAX_OUTPUT = 1000000
# What /exec (and a session's run) hold in memory per stream until the command ends, whatever
# max_output_bytes asks: the agent shares the sandbox's memory, and a command's output must not be able
# to exhaust it. /exec/stream holds nothing, so there max_output_bytes is taken as asked.
MAX_BUFFERED_OUTPUT = 16 << 20
READ_SIZE = 65536
# While a command runs and is silent, how often to check whether it exited with its pipes still held open
# by a background process it left behind (`server &`): then its result is returned without waiting for them.
EXIT_POLL_S = 0.05
# After a timeout kill, how long to wait for the pipes to close (a process that left the group holds them).
KILL_GRACE_S = 0.5


class ExecSpec:
    """A validated ExecRequest (orchard/core/sandbox.py), resolved against the agent's context."""

    def __init__(self, body: dict, context):
        fields.reject_unknown(body, EXEC_FIELDS, "an exec request")
        command = fields.command(body)
        self.argv = ["/bin/sh", "-c", command] if isinstance(command, str) else command
        cwd = fields.optional_str(body, "cwd")
        self.cwd = context.resolve(cwd, "cwd") if cwd else context.workdir
        if not os.path.isdir(self.cwd):
            raise bad_request("cwd %r is not a directory in the sandbox; create it first or pass an "
                              "existing one" % self.cwd)
        self.env = dict(context.env)
        self.env.update(fields.str_dict(body, "env"))
        stdin = fields.optional_str(body, "stdin")
        self.stdin = None if stdin is None else stdin.encode("utf-8")
        self.timeout = fields.timeout(body)
        self.max_output = fields.positive_int(body, "max_output_bytes", DEFAULT_MAX_OUTPUT)


class CommandRun:
    """One running command. `pump(emit)` drives it to the end, handing `emit(stream, bytes)` the kept
    output as it arrives; `result()` is then the ExecResult fields (without stdout/stderr)."""

    def __init__(self, spec: ExecSpec, popen=None, child=None):
        """`popen` and `child`: how and as whom the command starts (default: as the workload's, in its
        cgroup and pid namespace; services.py runs a check as the task services' user)."""
        self.spec = spec
        self.start = time.monotonic()
        self.deadline = None if spec.timeout is None else self.start + spec.timeout
        self.timed_out = False
        self.truncated = {"stdout": False, "stderr": False}
        self._kept = {"stdout": 0, "stderr": 0}
        self.spawn_error = None
        self.proc = None
        try:
            self.proc = (popen or workload_cgroup.popen)(
                spec.argv, cwd=spec.cwd, env=spec.env, start_new_session=True, close_fds=True,
                stdin=subprocess.DEVNULL if spec.stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **(identity.CHILD if child is None else child))
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            # Reported like a shell would (127 not found / 126 not executable), as the command's own result.
            self.spawn_error = exc
        except OSError as exc:
            raise ApiError(500, "error", "could not start the command: %s (%s)" % (exc, pidns.spawn_hint()))

    # -- driving ---------------------------------------------------------------------------------
    def pump(self, emit):
        if self.proc is None:
            self._keep("stderr", ("orchard-agent: cannot run %r: %s\n"
                                  % (self.spec.argv[0], self.spawn_error.strerror)).encode(), emit)
            return
        try:
            self._pump(emit)
            if self.proc.returncode is not None and getattr(self.proc, "status_lost", False):
                self._keep("stderr", workload_cgroup.LOST_NOTE, emit)
        finally:
            if self.proc.returncode is None and self.proc.poll() is None:
                self.kill()  # we are leaving early (client gone, error): nothing may keep running
                self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()

    def _pump(self, emit):
        proc = self.proc
        names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        sel = selectors.DefaultSelector()
        try:
            for fd in names:
                sel.register(fd, selectors.EVENT_READ)
            stdin_left = memoryview(self.spec.stdin) if self.spec.stdin is not None else None
            if stdin_left is not None:
                if stdin_left:
                    os.set_blocking(proc.stdin.fileno(), False)
                    sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
                else:
                    proc.stdin.close()
            next_exit_check = time.monotonic() + EXIT_POLL_S
            while any(fd in sel.get_map() for fd in names):
                now = time.monotonic()
                if self.deadline is not None and now >= self.deadline:
                    self._time_out(sel, names, emit)
                    return
                if now >= next_exit_check:
                    if proc.poll() is not None:
                        self._drain_ready(sel, names, emit)  # exited; what it left behind holds the pipes
                        break
                    next_exit_check = now + EXIT_POLL_S
                wait = next_exit_check - now
                if self.deadline is not None:
                    wait = min(wait, self.deadline - now)
                events = sel.select(wait)
                for key, _ in events:
                    if key.fd in names:
                        data = os.read(key.fd, READ_SIZE)
                        if data:
                            self._keep(names[key.fd], data, emit)
                        else:
                            sel.unregister(key.fd)
                    else:
                        stdin_left = self._feed(sel, stdin_left)
        finally:
            sel.close()
        if proc.stdin is not None:
            proc.stdin.close()  # no more feeding: a command still reading its stdin must see EOF
        self._wait()

    def _feed(self, sel, left):
        """Write what the pipe takes now; the child may not read all of its stdin (that is fine)."""
        fd = self.proc.stdin.fileno()
        try:
            left = left[os.write(fd, left[:READ_SIZE]):]
        except BlockingIOError:
            return left
        except BrokenPipeError:
            left = left[:0]
        if not left:
            sel.unregister(fd)
            self.proc.stdin.close()
        return left

    def _keep(self, name: str, data: bytes, emit):
        room = self.spec.max_output - self._kept[name]
        if len(data) > room:
            self.truncated[name] = True
            data = data[:max(room, 0)]
        if data:
            self._kept[name] += len(data)
            emit(name, data)

    def _drain_ready(self, sel, names, emit):
        """Read what is already in the pipes without waiting for writers that are still alive (nor for
        long, should one of them keep writing)."""
        give_up = time.monotonic() + EXIT_POLL_S
        for fd in list(names):
            if fd not in sel.get_map():
                continue
            os.set_blocking(fd, False)
            try:
                while time.monotonic() < give_up:
                    data = os.read(fd, READ_SIZE)
                    if not data:
                        break
                    self._keep(names[fd], data, emit)
            except BlockingIOError:
                pass

    def _wait(self):
        try:
            left = None if self.deadline is None else max(self.deadline - time.monotonic(), 0)
            self.proc.wait(left)
        except subprocess.TimeoutExpired:  # it closed its output but kept running
            self.timed_out = True
            self.kill()
            self.proc.wait()

    def _time_out(self, sel, names, emit):
        self.timed_out = True
        self.kill()
        grace_end = time.monotonic() + KILL_GRACE_S
        while len(sel.get_map()) and time.monotonic() < grace_end:
            for key, _ in sel.select(max(grace_end - time.monotonic(), 0)):
                if key.fd not in names:
                    sel.unregister(key.fd)
                    continue
                data = os.read(key.fd, READ_SIZE)
                if data:
                    self._keep(names[key.fd], data, emit)
                else:
                    sel.unregister(key.fd)
        self.proc.wait()

    def kill(self):
        """SIGKILL the whole process group: the command, and every child it started that stayed in it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # -- outcome ---------------------------------------------------------------------------------
    def result(self) -> dict:
        if self.proc is None:
            code = 126 if isinstance(self.spawn_error, PermissionError) else 127
        elif self.timed_out:
            code = None
        else:
            code = self.proc.returncode
            if code < 0:  # killed by a signal: reported the way shells do
                code = 128 - code
        return {"exit_code": code, "stdout": "", "stderr": "",
                "stdout_truncated": self.truncated["stdout"], "stderr_truncated": self.truncated["stderr"],
                "duration_s": round(time.monotonic() - self.start, 6), "timed_out": self.timed_out}


def handle_exec(req) -> dict:
    return run_whole(ExecSpec(req.json(), req.context))


def run_whole(spec: ExecSpec, popen=None, child=None) -> dict:
    """Run to the end, holding the kept output: the ExecResult fields."""
    spec.max_output = min(spec.max_output, MAX_BUFFERED_OUTPUT)  # the rest is dropped, flagged truncated
    run = CommandRun(spec, popen, child)
    out = {"stdout": [], "stderr": []}
    run.pump(lambda name, data: out[name].append(data))
    result = run.result()
    for name, parts in out.items():
        result[name] = b"".join(parts).decode("utf-8", "replace")
    return result


def handle_exec_stream(req):
    run = CommandRun(ExecSpec(req.json(), req.context))
    try:
        writer = req.start_chunked("application/x-ndjson")
    except OSError:  # the client is gone already: stop the command, reap it, close its pipes
        if run.proc is not None:
            run.kill()
        run.pump(lambda name, data: None)
        raise
    decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}

    def send(event: dict):
        writer.write(json.dumps(event, separators=(",", ":")).encode("utf-8") + b"\n")

    def emit(name, data):
        text = decoders[name].decode(data)
        if text:
            send({"kind": name, "data": text})

    run.pump(emit)  # a write to a gone client raises here, and pump kills the command on the way out
    for name, decoder in decoders.items():
        tail = decoder.decode(b"", final=True)
        if tail:
            send({"kind": name, "data": tail})
    send({"kind": "exit", "data": "", "result": run.result()})
    writer.close()
