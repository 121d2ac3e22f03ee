"""`/sessions`: named persistent shells. Each is one long-lived shell in its own process group with stderr
merged into stdout. A command is sent as `eval '<command>' </dev/null` followed by a printf of a random end
marker and `$?`; the output is whatever comes before the marker. No sleeps, no prompt parsing. cwd,
exported variables and shell variables persist because every command runs in that same shell.

The shell runs interactive (`-i`, prompts emptied; bash: history off, no line editing) for one reason:
like a terminal's Ctrl-C, a SIGINT to the session's process group then aborts the whole command line —
loops of builtins included — and the shell survives with status 130 (a non-interactive shell would exit).
bash reads its input a byte at a time, so the marker line sent after the command is still there and
prints 130. A POSIX sh (dash, busybox ash: images without bash) reads ahead and drops what it read when a
SIGINT aborts a line, so there the command and its marker are one line, and an interrupt sends the marker
again; a marker printed twice (the command had just ended) is dropped from later output."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import threading
import time

from . import execs, fields, identity, own_proc, pidns, workload_cgroup
from .wire import ApiError, bad_request, not_found

NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
DEFAULT_MAX_OUTPUT = 1000000
READ_SIZE = 65536
# After a timeout: how long the interrupted command gets to end after SIGINT, then after SIGKILL, before
# the shell itself is considered stuck (a loop of builtins) and replaced by a new one.
INTERRUPT_GRACE_S = 1.0
KILL_GRACE_S = 1.0
START_TIMEOUT_S = 10.0
# What bash -i without a terminal prints each time a command dies of a signal: noise, removed from output.
TTY_NOISE = re.compile(rb"bash: \[\d+: \d+ \(-?\d+\)\] tcsetattr: [^\n]*\n")
# Run once in a new bash, before the first command: empty prompts, no history (no `!` expansion either).
BASH_SETUP = "PS1= PS2= PS0= PROMPT_COMMAND=; unset HISTFILE MAIL MAILPATH; set +o history +H"
SH_SETUP = "PS1= PS2=; unset MAIL MAILPATH"
MARKER_FIRST_HALF = "__orchard_end_"
# A marker line of any command: one that was printed again by an interrupt after its command had ended.
ANY_MARKER_LINE = re.compile(rb"__orchard_end_[0-9a-f]{16}__ -?\d*\n")


class ShellExited(Exception):
    pass


class _Captured:
    """The first `cap` bytes of a command's output; the rest is dropped and flagged."""

    def __init__(self, cap: int):
        self.cap = cap
        self.parts = []
        self.size = 0
        self.truncated = False

    def add(self, data):
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        if data:
            self.parts.append(bytes(data))
            self.size += len(data)

    def note(self, text: str):
        """A line from the agent itself, kept even past the cap."""
        self.parts.append(("\n[orchard-agent: %s]\n" % text).encode("utf-8", "replace"))

    def text(self) -> str:
        return ANY_MARKER_LINE.sub(b"", TTY_NOISE.sub(b"", b"".join(self.parts))).decode("utf-8", "replace")


def _shell_argv(env: dict):
    """(executable, argv, is_bash): bash when the sandbox has it, else POSIX sh."""
    import shutil  # here, not at the agent's start, which every sandbox creation waits for

    bash = shutil.which("bash", path=env.get("PATH") or os.defpath)
    if bash:  # argv[0] "bash", whatever the path: it prefixes bash's own messages
        return bash, ["bash", "--noprofile", "--norc", "--noediting", "-i"], True
    return "/bin/sh", ["/bin/sh", "-i"], False


def _group_members(pgid: int):
    """Pids in process group `pgid` (from the agent's /proc), or None when /proc cannot be read."""
    try:
        entries = own_proc.listdir_proc()
    except OSError:
        return None
    pids = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with own_proc.open_proc("%s/stat" % entry, "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        fields_after_name = stat[stat.rfind(b")") + 2:].split()
        if len(fields_after_name) > 2 and int(fields_after_name[2]) == pgid:
            pids.append(int(entry))
    return pids


class ShellSession:
    def __init__(self, name: str, cwd: str, env: dict):
        self.name = name
        self.cwd = cwd
        self.env = env
        self.lock = threading.Lock()  # one command at a time; interrupt does not take it
        self.closed = False
        self.proc = None
        self._start(cwd)

    def _start(self, cwd: str):
        executable, argv, self.is_bash = _shell_argv(self.env)
        self.proc = workload_cgroup.popen(
            argv, executable=executable, cwd=cwd, env=self.env, start_new_session=True, close_fds=True,
            bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            **identity.CHILD)
        self.pending = bytearray()  # output read past the end of the last command
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout.fileno(), selectors.EVENT_READ)
        # Wait until the shell answers, dropping its start-up noise (bash -i: first prompt, job control).
        try:
            marker = self._send(BASH_SETUP if self.is_bash else SH_SETUP)
            started = self._read_until(marker, _Captured(0), time.monotonic() + START_TIMEOUT_S)[0]
        except ShellExited:
            started = False
        if not started:
            self._stop()
            raise OSError("%s did not start within %d s" % (argv[0], START_TIMEOUT_S))

    def _stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.selector.close()
        self.proc.stdin.close()
        self.proc.stdout.close()

    def _restart(self, cwd: str):
        self._stop()
        self._start(cwd if os.path.isdir(cwd) else self.cwd)

    # -- running ---------------------------------------------------------------------------------
    def run(self, command: str, timeout, cap: int) -> dict:
        with self.lock:
            if self.closed:
                raise not_found("session %r was deleted" % self.name)
            if self.proc.poll() is not None:
                self._restart(self.cwd)
            start = time.monotonic()
            out = _Captured(cap)
            code, timed_out = None, False
            try:
                marker = self._send(command)
                found, code = self._read_until(marker, out, None if timeout is None else start + timeout)
                if not found:
                    timed_out = True
                    self._end_timed_out(marker, out)
            except ShellExited:
                code = self._after_exit(out)
            return {"output": out.text(), "exit_code": None if timed_out else code, "timed_out": timed_out,
                    "truncated": out.truncated, "duration_s": round(time.monotonic() - start, 6)}

    def _send(self, command: str) -> str:
        token = os.urandom(8).hex()  # what secrets.token_hex(8) is, without importing secrets at start
        # The marker is printed from two halves, so it never appears whole in the input the shell may
        # echo (set -v / set -x): only the printf output can match.
        self.marker_printf = "printf '%%s%%s %%d\\n' '%s' '%s' \"$?\"" % (MARKER_FIRST_HALF, token + "__")
        # `\\builtin`: user aliases or functions named eval or printf cannot interfere.
        builtin = "\\builtin " if self.is_bash else ""
        # bash: two lines (see the module's docstring); sh: one, which an interrupt aborts whole.
        script = ("%seval '%s' </dev/null%s%s%s\n"
                  % (builtin, command.replace("'", "'\\''"), "\n" if self.is_bash else "; ", builtin,
                     self.marker_printf)).encode("utf-8")
        self._write(script)
        return MARKER_FIRST_HALF + token + "__"

    def _write(self, data: bytes):
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.proc.stdin.fileno(), view):]
        except BrokenPipeError:
            raise ShellExited()

    def _read_until(self, marker: str, out: _Captured, deadline):
        """Move output into `out` until the marker line; (True, exit status) or (False, None) at deadline."""
        mark = marker.encode()
        fd = self.proc.stdout.fileno()
        while True:
            at = self.pending.find(mark)
            if at >= 0:
                out.add(self.pending[:at])
                del self.pending[:at]
                end = self.pending.find(b"\n", len(mark))
                if end >= 0:
                    status = self.pending[len(mark):end].strip()
                    del self.pending[:end + 1]
                    return True, int(status) if status.lstrip(b"-").isdigit() else None
            elif len(self.pending) >= len(mark):  # keep a tail that may be the start of the marker
                cut = len(self.pending) - len(mark) + 1
                out.add(self.pending[:cut])
                del self.pending[:cut]
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and (wait <= 0 or not self.selector.select(wait)):
                return False, None
            data = os.read(fd, READ_SIZE)
            if not data:
                out.add(self.pending)
                raise ShellExited()
            self.pending += data

    def _end_timed_out(self, marker: str, out: _Captured):
        """SIGINT the command, then SIGKILL it, and if the shell itself still does not reach the marker
        (it is looping in builtins), replace the shell, keeping its cwd."""
        for stop, grace in ((self.interrupt, INTERRUPT_GRACE_S),
                            (lambda: self._signal_children(signal.SIGKILL), KILL_GRACE_S)):
            stop()
            if self._read_until(marker, out, time.monotonic() + grace)[0]:
                return
        cwd = self._shell_cwd()
        self._restart(cwd)
        out.note("the shell did not stop after the timeout and was replaced by a new one in %s; shell "
                 "variables and exports were lost" % cwd)

    def _after_exit(self, out: _Captured) -> int:
        """The command ended the shell (`exit`, `exec`, a fatal error): report its status, start afresh."""
        try:
            code = self.proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # it only closed its output (`exec >&- 2>&-`): end it
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        code = 128 - code if code < 0 else code
        if not self.closed:
            self._restart(self.cwd)
            out.note("the shell exited with status %d; a new one was started in %s" % (code, self.cwd))
        return code

    def _shell_cwd(self) -> str:
        try:
            return own_proc.readlink_proc("%d/cwd" % self.proc.pid)
        except OSError:
            return self.cwd

    # -- signals ---------------------------------------------------------------------------------
    def interrupt(self):
        """Ctrl-C for the running command: SIGINT to the session's whole process group; the interactive
        shell aborts the command line and survives (see the module's docstring)."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            return
        if not self.is_bash:  # sh dropped the rest of the line, its marker included: print it again
            try:
                self._write(("%s\n" % self.marker_printf).encode("utf-8"))
            except ShellExited:
                pass

    def _signal_children(self, sig: int):
        """Signal every process the shell started (its process group minus the shell itself); without
        /proc, the whole group."""
        members = _group_members(self.proc.pid)
        if members is None:
            targets, group = [], True
        else:
            targets, group = [pid for pid in members if pid != self.proc.pid], False
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            for pid in targets:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self):
        """Kill the shell's whole group; a command running now then ends (EOF) and its run returns."""
        self.closed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        with self.lock:
            self._stop()


class SessionRegistry:
    def __init__(self, context):
        self.context = context
        self.sessions = {}
        self.lock = threading.Lock()

    def get(self, name: str) -> ShellSession:
        session = self.sessions.get(name)
        if session is None:
            raise not_found("no session %r; create it with POST /sessions first (existing: %s)"
                            % (name, ", ".join(sorted(self.sessions)) or "none"))
        return session

    def create(self, body: dict) -> dict:
        fields.reject_unknown(body, ("name", "cwd", "env"), "a session request")
        name = body.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise bad_request("session name must be 1-128 letters, digits, '.', '_' or '-', not %r" % (name,))
        cwd = fields.optional_str(body, "cwd")
        cwd = self.context.resolve(cwd, "cwd") if cwd else self.context.workdir
        if not os.path.isdir(cwd):
            raise bad_request("cwd %r is not a directory in the sandbox; create it first" % cwd)
        env = dict(self.context.env)
        env.update(fields.str_dict(body, "env"))
        with self.lock:
            if name in self.sessions:
                raise bad_request("session %r already exists; use it, or DELETE /sessions/%s first"
                                  % (name, name))
            try:
                self.sessions[name] = ShellSession(name, cwd, env)
            except OSError as exc:
                raise ApiError(500, "error", "could not start a shell: %s (%s)" % (exc, pidns.spawn_hint()))
        return {"name": name}

    def delete(self, name: str):
        with self.lock:
            session = self.get(name)
            del self.sessions[name]
        session.close()

    def close_all(self):
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            session.close()


def handle_create(req) -> dict:
    return req.context.sessions.create(req.json())


def handle_list(req) -> dict:
    registry = req.context.sessions
    with registry.lock:
        return {"sessions": sorted(registry.sessions)}


def handle_run(req, name: str) -> dict:
    session = req.context.sessions.get(name)
    body = req.json()
    fields.reject_unknown(body, ("command", "timeout", "max_output_bytes"), "a session run request")
    command = body.get("command")
    if not isinstance(command, str) or not command.strip():
        raise bad_request("command must be a non-empty shell string")
    if "\x00" in command:
        raise bad_request("command must not contain NUL bytes")
    # Held in memory until the command ends: at most execs.MAX_BUFFERED_OUTPUT, whatever is asked.
    return session.run(command, fields.timeout(body),
                       min(fields.positive_int(body, "max_output_bytes", DEFAULT_MAX_OUTPUT),
                           execs.MAX_BUFFERED_OUTPUT))


def handle_interrupt(req, name: str) -> dict:
    session = req.context.sessions.get(name)
    if session.lock.locked():  # only a running command is interrupted; an idle shell is left alone
        session.interrupt()
    return {}


def handle_delete(req, name: str) -> dict:
    req.context.sessions.delete(name)
    return {}
