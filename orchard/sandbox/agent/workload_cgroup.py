"""The agent apart from its workload's memory and process limits: commands start in the sandbox's
`workload` cgroup, the agent stays in `agent` (Linux; the local backend run as root).

The backend makes the sandbox's cgroup with two leaves (backends/local/cgroups.py): `agent`, where the sandbox
starts (the agent, its init), and `workload`, which has the spec's memory and process limits; and it
hands the agent `--workload-cgroup-fds`, descriptors of the `workload` leaves' `cgroup.procs` files that
it opened itself (as host root: the sandbox's cgroupfs is read-only and another uid's, so nothing inside
could open them; the kernel checks the opener's credentials on every write). A process written there
moves into `workload`, and so is born everything it starts from then on.

A cgroup is joined by a process, not by a thread, and the commands must start with vfork (a preexec hook
or a fork costs ~0.7 ms per command). So the agent keeps a spawner process (forkserver.py) in `workload`:
it forks it from its pid namespace's spawner thread (pidns.py: the spawner is then in the workload's pid
namespace, as the commands must be), writes its pid into `workload` before sending it anything, and hands
it each command with its pipes (it starts them with posix_spawn, see forkserver.py). The spawner is the commands' parent and reports their exit; the agent
knows them by the pids of its own namespace (from a pidfd's fdinfo), so it can signal their process
groups as before. A workload that fills its memory meets its own limit: the OOM killer chooses among its
processes only, so the command gets SIGKILL (exit 137) and the agent answers on. The spawner shares the
commands' uid, so the workload can kill it: the commands it started then have no known exit status
(reported as killed, 137, with a line on stderr saying so), and the next command starts a new spawner.
One the workload stopped (SIGSTOP) is killed and replaced the same way, once a command it started has
ended (its pidfd) without its exit reported for STALL_S, or a request went unanswered for REPLY_TIMEOUT_S.

Wherever this cannot work (no pid namespace of the workload's own, an agent under a uid of its own, a
Python without os.pidfd_open), the agent moves itself into `workload` before it runs anything of the
workload's: the limits hold exactly as before the split, and /health says `"workload_cgroup": "shared"`.
(If the agent itself cannot be moved, it refuses to serve.) Without the descriptors (no cgroups, not root)
it says `"none"`. A spawner that cannot be started or moved later fails that command (500, saying why, no
command runs outside `workload`); the next command tries again.

The agent's whole side of the spawner (starting, replacing and asking it, and `WorkloadPopen`, the Popen
its commands are) is this one file, a little over ~400 lines; the spawner's own side is forkserver.py."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from . import forkserver, own_proc, pidns

STATE = "none"  # "separate": commands start in `workload` through the spawner; "shared": the agent is in it
WHY_SHARED = None
LOST_RETURNCODE = -signal.SIGKILL
LOST_NOTE = (b"orchard-agent: the command's spawner was killed or stopped (by the workload or the OOM "
             b"killer) before the command ended, so its exit status is unknown; reported as killed\n")
REPLY_TIMEOUT_S = 10.0  # a spawner the workload stopped (SIGSTOP) is replaced after this
STALL_S = 2.0  # a command ended this long ago without its exit reported: the spawner is stopped (replaced)
STALL_CHECK_S = 0.5

_procs_fds = []
_lock = threading.Lock()  # one spawn at a time, and one spawner start
_current = None  # the running _Spawner


def health() -> str:
    return STATE


def setup(fds_text: str):
    """Before serving: take the `workload` cgroup descriptors; fall back to moving the agent itself into
    `workload` where commands cannot be started there apart from it. Raises OSError when even that fails
    (then the sandbox's limits would not hold: the agent must not serve)."""
    global STATE, _procs_fds
    from . import identity

    _procs_fds = [int(fd) for fd in fds_text.split(",") if fd]
    for fd in _procs_fds:
        os.set_inheritable(fd, False)
    why_not = None
    if not pidns.SEPARATE:
        why_not = "the commands share the agent's pid namespace"
    elif identity.CHILD:
        why_not = "the agent runs under a uid of its own, so its commands cannot start with vfork elsewhere"
    elif not hasattr(os, "pidfd_open"):
        why_not = "this Python has no os.pidfd_open (3.9+)"
    if why_not is not None:
        _share(why_not)
    else:
        STATE = "separate"


def _share(why: str):
    """Move the whole agent into `workload`: every process it starts from now on is born there."""
    global STATE, WHY_SHARED
    for fd in _procs_fds:
        os.write(fd, b"0")  # 0: the writer's own thread group
    STATE, WHY_SHARED = "shared", why
    sys.stderr.write("orchard-agent: commands share the agent's cgroup (%s)\n" % why)
    sys.stderr.flush()


def start_soon():
    """Once the first request is answered (the backend's /health): start the first spawner in the
    background, so that a command that comes later (a sandbox waiting in a pool) need not wait for its
    fork and move (the first cgroup.procs write in a while waits for an RCU grace period, ~10 ms here).
    Started before READY instead, the fork made the rest of the agent's start copy the pages it wrote:
    create->ready grew as much as the first command saved (measured on 2 loaded cores: +14 ms create,
    -15 ms first exec); started at READY, the move held up the thread that answers that /health (no
    fork or thread starts while a process changes cgroups): 5-8 ms of create->ready. A command that
    comes first starts the spawner itself."""
    if STATE == "separate":
        threading.Thread(target=_ensure_quietly, name="spawner-start", daemon=True).start()


def _ensure_quietly():
    with _lock:
        try:
            _ensure()
        except OSError:
            pass  # said on stderr; the first command tries again


def popen(*args, **kwargs):
    """subprocess.Popen, started in `workload` (through the spawner when the agent is not in it)."""
    if STATE != "separate":
        return pidns.popen(*args, **kwargs)
    return WorkloadPopen(*args, **kwargs)


def _ensure():
    """The running spawner (started, and moved into `workload`, if there is none). Under _lock."""
    global _current
    if _current is not None and _current.alive:
        return _current
    _current = None
    try:
        _current = _Spawner()
    except OSError as exc:
        sys.stderr.write("orchard-agent: could not start the workload's spawner: %s\n" % exc)
        raise
    return _current


class SpawnerGone(OSError):
    """The spawner had exited before it took a command: the command did not start anywhere."""

    def __init__(self):
        super().__init__("the workload's spawner has exited; it is replaced at the next command")


class _Spawner:
    def __init__(self):
        self.alive = True
        self.reaping, self.reaped = threading.Lock(), False
        self.procs = {}  # spawn id -> WorkloadPopen, until its exit is known
        self.early = {}  # spawn id -> returncode that came before the spawn's answer was read
        self.next_id = 0
        self.last_env = None  # the environment the spawner has, to send again only when it changes
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        events, their_events = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

        def fork():
            pid = os.fork()
            if pid == 0:
                mine.close()
                events.close()
                forkserver.main(theirs, their_events, own_fsuid=pidns.PROC_FSUID is not None)
            return pid

        try:
            self.pid = pidns._spawner.run(fork) if pidns._spawner is not None else fork()
        except BaseException:
            for s in (mine, theirs, events, their_events):
                s.close()
            raise
        theirs.close()
        their_events.close()
        self.requests, self.events = mine, events
        self.requests.settimeout(REPLY_TIMEOUT_S)
        try:
            for fd in _procs_fds:  # before it is sent anything: all it starts is born in `workload`
                os.write(fd, b"%d" % self.pid)
        except OSError as exc:
            self._kill()
            # A plain OSError (no errno subclass): a failure of the sandbox, never the command's "not found"
            raise OSError("moving it into the workload's cgroup: %s" % exc.strerror) from None
        threading.Thread(target=self._read_events, name="spawner-events", daemon=True).start()

    def spawn(self, message: dict, fds: list):
        """(spawn id, pidfd) of the started command; raises what starting raised. The environment is sent
        only when it differs from the last one (encoding it is most of a request's cost)."""
        self.next_id += 1
        message["id"] = self.next_id
        env = message.pop("env")
        if env is not None and env == self.last_env:
            message["same_env"] = True
        else:
            message["env"] = None if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
            self.last_env = None if env is None else dict(env)
        # The spawner lives in the workload, which may kill it at any moment (`kill -KILL -1`); its death
        # also closes `requests` under us (the events reader's _kill), hence any OSError means "gone".
        taken, _ = self._answer(lambda: forkserver.send(self.requests, message, fds))
        if taken is None:  # gone before it took the command (it answers that first): nothing started
            self._kill()
            raise SpawnerGone()
        answer, got = self._answer()
        if answer is None:  # e.g. the command itself killed it before its pid was sent
            self._kill()
            raise OSError("the workload's spawner exited while it started the command; it is replaced at "
                          "the next command")
        if "pid" not in answer or len(got) != 1:
            for fd in got:
                os.close(fd)
            if "errno" in answer:
                raise OSError(answer["errno"], answer["strerror"], answer["filename"])
            raise OSError("the workload's spawner could not start the command: %s"
                          % answer.get("error", "no pidfd came with its answer"))
        return self.next_id, got[0]

    def _answer(self, before=None):
        """The spawner's next message (after `before`): (message, fds), or (None, []) when it is gone;
        raises OSError, having killed it, when it did not answer in time (stopped by the workload)."""
        try:
            if before is not None:
                before()
            return forkserver.receive(self.requests)
        except socket.timeout:  # TimeoutError from Python 3.10 on
            self._kill()
            raise OSError("the workload's spawner did not answer (stopped?); it is replaced at the next "
                          "command") from None
        except (OSError, forkserver.ProtocolError, ValueError):
            return None, []

    def _read_events(self):
        try:
            while True:
                message, fds = forkserver.receive(self.events)
                for fd in fds:
                    os.close(fd)
                if message is None:
                    break
                with _lock_events:
                    proc = self.procs.pop(message["id"], None)
                    if proc is None:
                        self.early[message["id"]] = message["returncode"]
                if proc is not None:
                    proc._finish(message["returncode"])
        except (OSError, forkserver.ProtocolError, ValueError):
            pass
        self.alive = False
        with _lock_events:
            orphans, self.procs = list(self.procs.values()), {}
        for proc in orphans:
            proc._finish(LOST_RETURNCODE, lost=True)
        self._kill()
        self.events.close()

    def register(self, spawn_id: int, proc) -> None:
        with _lock_events:
            early = self.early.pop(spawn_id, None)
            if early is None:
                self.procs[spawn_id] = proc
        if early is not None:
            proc._finish(early)

    def stall(self):
        sys.stderr.write("orchard-agent: the workload's spawner (pid %d) reports no exit of commands that have "
                         "ended (stopped?); replacing it\n" % self.pid)
        sys.stderr.flush()
        self._kill()

    def _kill(self):
        """End this spawner (idempotent): the commands it started go on, orphans of its namespace's init."""
        self.alive = False
        with self.reaping:
            if self.reaped:
                return  # its pid may be another process's by now
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.reaped = True
        self.requests.close()


_lock_events = threading.Lock()
_EXECUTE_ARGS = subprocess.Popen._execute_child.__code__.co_varnames[
    1:subprocess.Popen._execute_child.__code__.co_argcount]


def _agent_pid(pidfd: int) -> int:
    """The pid of a pidfd's process as the agent's pid namespace numbers it."""
    path = "self/fdinfo/%d" % pidfd
    if own_proc.FD is None:
        fd = os.open("/proc/" + path, os.O_RDONLY | os.O_CLOEXEC)
    else:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=own_proc.FD)
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    at = data.find(b"\nPid:")
    if at < 0:
        raise OSError("no Pid in the fdinfo of a pidfd")
    return int(data[at + 5:data.index(b"\n", at + 1)])


class WorkloadPopen(subprocess.Popen):
    """A subprocess.Popen whose child the workload's spawner starts (and reaps): same pipes, pid (in the
    agent's namespace), poll, wait, returncode. `status_lost`: the spawner died before the command."""

    status_lost = False

    def _execute_child(self, *args):
        a = dict(zip(_EXECUTE_ARGS, args))
        for name in ("preexec_fn", "uid", "gid", "gids"):
            if a.get(name) is not None:
                raise ValueError("%s is not supported for commands of the workload's cgroup" % name)
        if a.get("pass_fds") or a.get("umask", -1) >= 0 or a.get("process_group", -1) >= 0:
            raise ValueError("pass_fds, umask and process_group are not supported here")
        command = a["args"]
        command = [command] if isinstance(command, (str, bytes, os.PathLike)) else list(command)
        command = [os.fsdecode(part) for part in command]
        executable = a["executable"]
        if a["shell"]:
            command = ["/bin/sh", "-c"] + command
            if executable:
                command[0] = executable
        executable = os.fsdecode(executable) if executable is not None else command[0]
        std, fds = [], []
        for fd in (a["p2cread"], a["c2pwrite"], a["errwrite"]):
            if fd == -1:
                std.append(-1)
            else:
                if fd not in fds:
                    fds.append(fd)
                std.append(fds.index(fd))
        cwd = a["cwd"]
        env = a["env"]
        message = {"args": command, "executable": executable,
                   "cwd": os.fsdecode(cwd) if cwd is not None else None, "env": env,
                   "std": std, "new_session": bool(a["start_new_session"]),
                   "restore_signals": bool(a["restore_signals"])}
        self._exited = threading.Event()
        self._status = None
        self._pidfd_lock = threading.Lock()
        try:
            with _lock:
                spawner = _ensure()
                try:
                    spawn_id, self._pidfd = spawner.spawn(dict(message), fds)
                except SpawnerGone:  # killed before it took the command: a new one starts it, once
                    spawner = _ensure()
                    spawn_id, self._pidfd = spawner.spawn(dict(message), fds)
                self._spawner = spawner
                try:
                    self.pid = _agent_pid(self._pidfd)
                except OSError:
                    self._close_pidfd()
                    raise
                self._child_created = True
                spawner.register(spawn_id, self)
        finally:
            self._close_pipe_fds(a["p2cread"], a["p2cwrite"], a["c2pread"], a["c2pwrite"],
                                 a["errread"], a["errwrite"])

    def _finish(self, returncode: int, lost: bool = False):
        self._status, self.status_lost = returncode, lost
        self._exited.set()

    def _internal_poll(self, *args, **kwargs):
        if self.returncode is None:
            if self._exited.is_set():
                self._done()
            else:
                self._check_stall()
        return self.returncode

    def _wait(self, timeout):
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._exited.wait(STALL_CHECK_S if deadline is None
                                    else max(min(STALL_CHECK_S, deadline - time.monotonic()), 0)):
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._check_stall()
        return self._done()

    def _done(self):
        self.returncode = self._status
        self._close_pidfd()
        return self.returncode

    _pidfd = None
    _exited_seen = None

    def _check_stall(self):
        """The command has ended (its pidfd is readable) but no exit status came for STALL_S: the spawner
        is stopped or stuck (the workload can SIGSTOP it). It is killed, so every command it started is
        reported as lost, instead of this wait lasting forever; the next command starts a new one."""
        with self._pidfd_lock:
            if self._pidfd is None or not select.select([self._pidfd], [], [], 0)[0]:
                return
        now = time.monotonic()
        if self._exited_seen is None:
            self._exited_seen = now
        elif now - self._exited_seen >= STALL_S:
            self._spawner.stall()

    def _close_pidfd(self):
        with self._pidfd_lock:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None

    def __del__(self):
        if getattr(self, "_pidfd_lock", None) is not None:
            self._close_pidfd()
        super().__del__()
