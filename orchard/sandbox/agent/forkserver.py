"""The workload's spawner: a small process, forked from the agent, that lives in the sandbox's `workload`
cgroup and starts the commands there (see workload_cgroup.py for why and for the agent's side).

It talks to the agent over two Unix stream socketpairs, messages framed as a 4-byte length and JSON:
- `requests` (agent -> spawner, one at a time, each answered): `{"id", "args", "executable", "cwd", "env",
  "std": [i, i, i], "new_session", "restore_signals"}` with the command's stdin/stdout/stderr descriptors
  attached (SCM_RIGHTS; `std` indexes them, -1: inherit /dev/null). It starts the command with
  posix_spawn (glibc's clone(CLONE_VM|CLONE_VFORK) + exec, as subprocess's vfork would; `"same_env": true`
  in place of `env`: the previous request's) and answers `{"pid"}` with a pidfd
  of the command attached, from which the agent learns the pid as its own namespace numbers it, or
  `{"errno", "strerror", "filename"}` / `{"error"}` when it could not start;
- `events` (spawner -> agent): `{"id", "returncode"}` when a command it started has exited (it is their
  parent, so it reaps them: each command's pidfd is in its selector).
It ends when the agent's end of `requests` closes. It never reads anything but those requests: the
descriptors it inherited from the agent are closed first, and it holds no secret the agent did not (it is
non-dumpable like the agent, so the workload cannot read its memory)."""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import sys

HEADER = struct.Struct("!I")
# The commands' oom_score_adj, above the spawner's own (0): when the workload fills its memory, the OOM
# killer ends one of them before the spawner, which would take their exit statuses with it.
COMMAND_OOM_SCORE_ADJ = b"500"
MAX_MESSAGE = 64 << 20  # a request holds a command line and an environment, far below this
NAME = b"orchard-spawner"


class ProtocolError(Exception):
    """The other side sent something that is not a message of this protocol."""


def send(sock: socket.socket, message: dict, fds=()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8", "surrogateescape")
    payload = HEADER.pack(len(data)) + data
    if fds:
        sent = sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sent = sock.send(payload)
    if sent < len(payload):
        sock.sendall(payload[sent:])


def receive(sock: socket.socket):
    """(message, fds), or (None, []) when the other side has closed. Received fds are close-on-exec."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(HEADER.size, socket.CMSG_SPACE(4 * fds.itemsize),
                                         getattr(socket, "MSG_CMSG_CLOEXEC", 0))
    for level, kind, cdata in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    data = _exactly(sock, data, HEADER.size)
    size, = HEADER.unpack(data)
    if size > MAX_MESSAGE:
        raise ProtocolError("message of %d bytes" % size)
    return json.loads(_exactly(sock, b"", size).decode("utf-8", "surrogateescape")), list(fds)


def _exactly(sock, have: bytes, size: int) -> bytes:
    parts, got = [have], len(have)
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            raise ProtocolError("the connection closed inside a message")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def main(requests: socket.socket, events: socket.socket, own_fsuid: bool = False):
    """The spawner's life, in the forked child. Never returns. `own_fsuid`: it was forked with the file
    system uid of its /proc files' owner (pidns.py `PROC_FSUID`, an agent the zygote forked): it opens
    its oom_score_adj with it, then takes its own uid's for good, before anything else."""
    status = 0
    try:
        adj = _oom_score_adj()
        if own_fsuid:
            from . import identity

            identity.take_fsuid(os.getuid())
        _set_up(requests.fileno(), events.fileno(), adj[0])
        _serve(requests, events, adj)
    except BaseException:
        # Otherwise the agent sees only a closed socket: say why in the agent's log (stderr stays open).
        import traceback

        status = 1
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - the log itself is gone: nothing left to tell
            pass
    finally:
        os._exit(status)


def _set_up(*keep):
    import gc
    import signal

    gc.freeze()  # the agent's copied heap: never traversed, so its pages stay shared
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    low = 3
    for fd in sorted(fd for fd in keep if fd is not None):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the agent's stdout is its READY pipe to the backend; stderr (its log) stays
    os.close(null)
    try:
        with open("/proc/thread-self/comm", "wb") as f:
            f.write(NAME)
    except OSError:
        pass  # only a name for ps


def _oom_score_adj():
    """(fd of /proc/self/oom_score_adj, its value now), or (None, None) where it cannot be written."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None, None
    return fd, os.pread(fd, 16, 0).strip() or b"0"


def _serve(requests: socket.socket, events: socket.socket, adj):
    import selectors

    adj_fd, own_adj = adj
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ, None)
    last_env = None
    while True:
        for key, _ in selector.select():
            if key.data is None:
                message, fds = receive(requests)
                if message is None:
                    return  # the agent is gone or replaced us
                if message.pop("same_env", False):
                    message["env"] = last_env
                last_env = message.get("env")
                # Taken, before anything starts: a spawner that dies before this answer started nothing, so
                # the agent may send the command to a new one (the workload can kill us at any moment).
                send(requests, {"taken": message["id"]})
                answer, pidfd = _spawn(message, fds, selector, adj_fd, own_adj)
                send(requests, answer, [pidfd] if pidfd is not None else ())
            else:
                spawn_id, pid = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                send(events, {"id": spawn_id, "returncode": os.waitstatus_to_exitcode(status)})


def _spawn(message: dict, fds: list, selector, adj_fd, own_adj):
    """Start one command the way subprocess.Popen(args, executable, cwd, env, stdin/stdout/stderr,
    close_fds=True, start_new_session, restore_signals) does, with posix_spawn (half Popen's CPU): every
    descriptor of this process is close-on-exec, and the cwd is this process's own for the moment of
    the spawn (it has no other thread)."""
    import selectors
    import signal

    cwd = message["cwd"]
    try:
        if adj_fd is not None:
            _write_adj(adj_fd, COMMAND_OOM_SCORE_ADJ)  # inherited by the command, then ours again below
        env = os.environ if message["env"] is None else message["env"]
        executable = _executable(message["executable"], env)
        actions = [(os.POSIX_SPAWN_DUP2, fds[i], n) for n, i in enumerate(message["std"]) if i >= 0]
        if cwd is not None:
            os.chdir(cwd)
        sigdef = (signal.SIGPIPE, signal.SIGXFSZ) if message["restore_signals"] else ()
        pid = os.posix_spawn(executable, message["args"], env, file_actions=actions,
                             setsid=bool(message["new_session"]), setsigdef=sigdef, setsigmask=())
    except OSError as exc:
        return {"errno": exc.errno, "strerror": exc.strerror, "filename": exc.filename}, None
    except Exception as exc:  # ValueError (a NUL in the environment), a malformed request
        return {"error": "%s: %s" % (type(exc).__name__, exc)}, None
    finally:
        for fd in fds:
            os.close(fd)
        if adj_fd is not None:
            _write_adj(adj_fd, own_adj)
        if cwd is not None:
            os.chdir("/")
    pidfd = os.pidfd_open(pid)
    selector.register(pidfd, selectors.EVENT_READ, (message["id"], pid))
    return {"pid": pid}, pidfd


def _executable(name: str, env) -> str:
    """`name` as subprocess would run it: a path as is, a bare name from the PATH of the command's own
    environment (the first such file)."""
    if os.path.dirname(name):
        return name
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(2, os.strerror(2), name)


def _write_adj(fd: int, value: bytes):
    try:
        os.pwrite(fd, value, 0)
    except OSError:
        pass  # refused (a value below what this process may set): the commands share the spawner's
