"""The agent's zygote: one interpreter on the host, started once per local backend, with the agent already
imported; each sandbox's agent is forked from it into that sandbox, so no sandbox waits for an interpreter
to start and import the agent (Linux, run by root; see docs/local-backend.md#start-path).

The backend starts bubblewrap as usual, but with `--block-fd`: once bwrap has made the namespaces and
every mount (its new root pivoted), its namespace init blocks reading a pipe that nothing ever writes
(bwrap holds both ends), so it never runs a command and stays the pid namespace's init. The backend
sends the zygote a request (`serve`) as soon as bwrap runs: the fd its init will block on, the cgroups,
the agent's environment, working directory and arguments, and as file descriptors a socket to answer on,
a pipe on which the backend writes the init's pid once bwrap has reported it, the agent's listening
socket, the pipe for its READY line and its log. The zygote forks; the child (`_enter`)
  - joins the sandbox's cgroups (so everything after is limited from its first instruction) and, without
    a pids group, sets RLIMIT_NPROC; writes the sandbox's environment over its environment area;
  - reads the init's pid, waits until the init blocks on that fd (its mounts complete), then joins its
    namespaces with setns:
    user first, then cgroup, ipc, uts, net, pid and mount (the root and working directory become the
    sandbox's), skipping any it shares with the host (network `open`);
  - forks into the pid namespace a child that forks the agent and exits, so that the agent is adopted by
    the namespace's init like an agent bwrap started; answers with the agent's pid and exits.
The agent (`_become_agent`) then does what bwrap does before it runs a command: a new session, every
capability dropped but those the agent needs to set itself up (the bounding set too), no_new_privs, the
sandbox's environment and working directory, no descriptor but its own; and runs the agent's `main`
with the module search path pointing at the bundle where the sandbox has it mounted (/.orchard).

A child can also be forked ahead of its request (a park: `_start`), joining the cgroups of a spare made
before its sandbox (the backend's local/spares.py) and then waiting for the request on a socket of its
own, so that no cgroup move is left for the create.

The zygote reads requests until the backend closes its end, then exits; it reaps its own children (a
subreaper, in case any is orphaned); the agents are the sandboxes' own."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

# Imported here, before any fork, so that an agent finds its whole server loaded (the point of a zygote).
from . import __main__ as agent_main  # noqa: F401
from . import execs, files, forward, http1, identity, pidns, server, sessions, stats, tars, wire  # noqa: F401

MAX_REQUEST = 1 << 20
# setns order: the user namespace first (the others belong to it), the mount namespace last.
NAMESPACES = ("user", "cgroup", "ipc", "uts", "net", "pid", "mnt")
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 36, 38, 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
BLOCKED_TIMEOUT_S = 30.0
READ_SYSCALLS = ("0", "63")  # read(2) on x86-64 and on arm64/riscv64
# The command line agents show (they inherit the zygote's): the bundle's paths as a sandbox has them, not
# the host's, which say where Orchard keeps its state.
TITLE = b"/.orchard/runtime/bin/python3 -m orchard_agent (zygote)"
AGENT_TITLE = b"/.orchard/runtime/bin/python3 -m orchard_agent"  # each agent's (ps told them from the zygote)


class EnterError(Exception):
    pass


def serve(control_fd: int):
    """The zygote's loop on `control_fd` (a SOCK_SEQPACKET socket to the backend): one request, one fork.
    A request's first two descriptors are its own: a socket to answer on (so that the backend sends the
    next request at once, each create waiting only for its own answer) and a pipe on which the backend
    writes the pid of the sandbox's init once bwrap has reported it (so that the child forks and joins
    the cgroups while bwrap is still making the namespaces)."""
    libc, _ctypes = identity._libc(("prctl", "memcpy"))
    ulong = identity.ulong_type()
    libc["prctl"](ulong(PR_SET_CHILD_SUBREAPER), ulong(1), ulong(0), ulong(0), ulong(0))
    _set_command_line(libc, ulong, TITLE)
    signal.signal(signal.SIGCHLD, lambda signum, frame: _reap())
    import gc

    gc.collect()
    gc.freeze()  # what is imported stays shared with every agent instead of being copied by a collection
    control = socket.socket(fileno=control_fd)
    control.set_inheritable(False)
    # Requests are read into this one buffer and parsed only in the forked child; the zygote zeroes it
    # after each fork, so no later agent inherits an earlier sandbox's request (its environment).
    buffer = bytearray(MAX_REQUEST)
    sys.stdout.write("READY zygote\n")
    sys.stdout.flush()
    while True:
        size, fds = _receive(control, buffer)
        if not size:
            return
        try:
            pid = os.fork()
        except OSError as exc:
            _answer(fds, {"error": "the zygote could not fork: %s" % exc})
            pid = None
        if pid == 0:
            try:
                control.close()
                _start(json.loads(bytes(buffer[:size])), fds, buffer)
            finally:
                os._exit(1)
        buffer[:size] = bytes(size)
        for fd in fds:
            os.close(fd)


def _answer(fds: list, answer: dict):
    """Answer a request on its own socket (its first descriptor); nothing when it came without one."""
    if fds:
        try:
            os.write(fds[0], json.dumps(answer).encode())
        except OSError:
            pass  # the backend has given up on it


def _read_init_pid(fd: int) -> int:
    """The pid the backend writes on the request's pipe once bwrap has reported its init; EnterError when
    the backend closed it first (bwrap failed) or wrote nothing within BLOCKED_TIMEOUT_S."""
    import select

    data = b""
    deadline = time.monotonic() + BLOCKED_TIMEOUT_S
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise EnterError("the backend named no sandbox init within %g s" % BLOCKED_TIMEOUT_S)
        chunk = os.read(fd, 32)
        if not chunk:
            raise EnterError("the backend named no sandbox init (bwrap did not start)")
        data += chunk
    return int(data)


def _receive(control: socket.socket, buffer: bytearray):
    """(size, descriptors) of one request read into `buffer`; (0, []) once the backend has gone."""
    import array

    fds = array.array("i")
    while True:
        try:
            size, ancillary, _, _ = control.recvmsg_into([buffer], socket.CMSG_SPACE(16 * fds.itemsize))
            break
        except InterruptedError:
            continue
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return size, list(fds)


def _set_command_line(libc, ulong, title: bytes):
    """Overwrite this process's argument area (what /proc/PID/cmdline shows) with `title`."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2:].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 of stat
    data = title[:end - start - 1].ljust(end - start, b"\0")
    libc["memcpy"](ulong(start), data, ulong(len(data)))


def _reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _start(request: dict, fds: list, buffer: bytearray):
    """In the zygote's child: a request (`_enter`), or a park: the child joins the cgroups named now (a
    spare's, made before its sandbox: the backend's local/spares.py), says `parked` on the socket that came
    with it, and waits there for the request, so that no cgroup move is left for the create. Returns (to
    exit) when that socket closes first: the spare was discarded. The request is read into the zygote's
    `buffer` (copied on write: a new one would cost each parked child its megabyte)."""
    if not request.get("park"):
        _enter(request, fds)
        return
    park = socket.socket(fileno=fds[0])
    try:
        _join(request["cgroup_procs"])
        park.send(b"parked")
    except BaseException as exc:
        _answer(fds, {"error": "%s: %s" % (type(exc).__name__, exc)})
        return
    size, fds = _receive(park, buffer)
    park.close()
    if size:
        _enter(json.loads(bytes(buffer[:size])), fds)


def _join(cgroup_procs: list):
    """Move this process into the groups whose `cgroup.procs` files are named."""
    for procs in cgroup_procs:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))


def _enter(request: dict, fds: list):
    """In the zygote's child: see the module's docstring. Answers on the request's socket (`fds[0]`),
    then returns (to exit)."""
    answer_fd, init_fd, fds = fds[0], fds[1], fds[2:]
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _join(request["cgroup_procs"])
        if request.get("nproc"):
            import resource

            resource.setrlimit(resource.RLIMIT_NPROC, (request["nproc"], request["nproc"]))
        _show_environment({**request["env"], "PWD": request["cwd"]})  # bwrap sets PWD where it starts the agent
        libc, _ctypes = identity._libc(("memcpy",))
        _set_command_line(libc, identity.ulong_type(), AGENT_TITLE)
        init_pid = _read_init_pid(init_fd)
        os.close(init_fd)
        _wait_blocked(init_pid, request["block_fd"])
        # The host's view of the init, kept open: after setns the mount namespace's /proc is the sandbox's.
        init_task = os.open("/proc/%d/task/%d" % (init_pid, init_pid), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        libc, _ctypes = identity._libc(("setns",))
        targets = []
        for name in NAMESPACES:
            ours, theirs = os.stat("/proc/self/ns/" + name), os.stat("/proc/%d/ns/%s" % (init_pid, name))
            if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
                targets.append((name, os.open("/proc/%d/ns/%s" % (init_pid, name), os.O_RDONLY | os.O_CLOEXEC)))
        if not targets or targets[0][0] != "user":
            raise EnterError("the sandbox has no user namespace of its own")
        for name, fd in targets:
            if libc["setns"](fd, 0) != 0:
                raise EnterError("setns(%s): %s" % (name, os.strerror(_ctypes.get_errno())))
            os.close(fd)
        # Two forks: the first child is the first process of ours in the sandbox's pid namespace, and its
        # parent (this one) is outside it; it forks the agent and exits, so the agent is adopted by the
        # namespace's init (bwrap's), as an agent bwrap started is its child: the namespace's end never
        # waits for a reaper outside it (the zygote, or the host's init once the zygote is gone).
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(answer_fd)
                os.close(init_task)
                if os.fork() == 0:
                    _run_agent(request, fds)  # never returns
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise EnterError("could not fork the agent in the sandbox (wait status %d)" % status)
        children = os.open("children", os.O_RDONLY | os.O_CLOEXEC, dir_fd=init_task)
        with os.fdopen(children) as f:
            adopted = f.read().split()  # bwrap's init, blocked, has no child but the agent
        if len(adopted) != 1:
            raise EnterError("the sandbox's init has children %s, not just the agent" % adopted)
        _answer([answer_fd], {"agent_pid": int(adopted[0])})
    except BaseException as exc:
        _answer([answer_fd], {"error": "%s: %s" % (type(exc).__name__, exc)})


def _show_environment(env: dict):
    """Write the sandbox's environment over this process's environment area (what /proc/PID/environ
    shows: the kernel sets it at exec, and the zygote's holds the bundle's host paths), so that the agent
    and everything it forks without an exec (its spawner, the workload's init) show the sandbox's
    environment, as when bwrap started the agent. Moving the area needs CAP_SYS_RESOURCE of the host, so
    it is written in place: the backend starts the zygote with room for it (ENV_AREA), and the rest is
    zeroed. An environment larger than the area leaves it as it is (the zygote's: no secret in it)."""
    data = b"".join(b"%s=%s\0" % (os.fsencode(k), os.fsencode(v)) for k, v in env.items())
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    start, end = (int(field) for field in stat[stat.rfind(b")") + 2:].split()[47:49])  # fields 50 and 51
    if len(data) > end - start:
        return
    libc, _ctypes = identity._libc(("memcpy", "clearenv"))
    libc["clearenv"]()  # the C library's pointers into the area (the agent sets its own environment)
    ulong = identity.ulong_type()
    libc["memcpy"](ulong(start), data.ljust(end - start, b"\0"), ulong(end - start))


def _run_agent(request: dict, fds: list):
    """The agent's process: `_become_agent`, then exit with its status (never returns)."""
    try:
        code = _become_agent(request, fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:
        try:
            sys.stderr.write("orchard-agent: could not start in the sandbox: %s\n" % exc)
            sys.stderr.flush()
        finally:
            code = 2
    os._exit(code)


def _wait_blocked(init_pid: int, block_fd: int):
    """Until the sandbox's init (bwrap) reads `block_fd`: all its mounts are made by then."""
    expected = "0x%x" % block_fd
    deadline = time.monotonic() + BLOCKED_TIMEOUT_S
    while True:
        try:
            with open("/proc/%d/syscall" % init_pid) as f:
                fields = f.read().split()
        except OSError as exc:
            raise EnterError("the sandbox's init (pid %d) is gone: %s" % (init_pid, exc))
        if len(fields) > 1 and fields[0] in READ_SYSCALLS and fields[1] == expected:
            return
        if time.monotonic() > deadline:
            raise EnterError("bwrap did not finish its mounts within %g s" % BLOCKED_TIMEOUT_S)
        time.sleep(0.0002)


def _become_agent(request: dict, fds: list) -> int:
    """In the sandbox: what bwrap does before it runs a command, then the agent's main. Returns the exit
    status (main's, or 0)."""
    import fcntl

    targets = [1, 2, *request["fds"]]  # the READY pipe, the log, then the descriptors the arguments name
    if len(fds) != len(targets):
        raise EnterError("got %d descriptors for %d places" % (len(fds), len(targets)))
    # Above every target first, so that no dup2 below overwrites another of them.
    base = max(targets) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, base) for fd in fds]
    os.setsid()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)
    keep = sorted(set([0] + targets))
    for low, high in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")]):
        os.closerange(low + 1, high)
    _drop_to_setup_caps(request["caps"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    host, mounted = request["bundle_host"], request["bundle_mounted"]
    sys.path[:] = [mounted + p[len(host):] if p == host or p.startswith(host + "/") else p for p in sys.path]
    sys.argv = ["-c", *request["argv"]]
    agent_main.main(request["argv"])
    return 0


def _drop_to_setup_caps(keep: int):
    """The capabilities bwrap leaves the agent (`keep`, a mask: AGENT_SETUP_CAPS of the local backend's
    bwrap.py), in every set and the bounding set; none ambient; no_new_privs. Checked in /proc/self/status."""
    libc, _ctypes = identity._libc(("prctl", "capset"))
    ulong = identity.ulong_type()

    class uint32(_ctypes._SimpleCData):
        _type_ = "I"

    def check(result, what):
        if result != 0:
            raise EnterError("%s failed: %s" % (what, os.strerror(_ctypes.get_errno())))

    for cap in range(64):
        if keep & (1 << cap):
            continue
        if libc["prctl"](ulong(PR_CAPBSET_DROP), ulong(cap), ulong(0), ulong(0), ulong(0)) != 0:
            break  # EINVAL past the last capability the kernel knows (checked below)
    check(libc["prctl"](ulong(PR_CAP_AMBIENT), ulong(PR_CAP_AMBIENT_CLEAR_ALL), ulong(0), ulong(0), ulong(0)),
          "clearing the ambient capabilities")
    header = type("CapHeader", (_ctypes.Array,), {"_type_": uint32, "_length_": 2})(LINUX_CAPABILITY_VERSION_3, 0)
    low, high = keep & 0xFFFFFFFF, keep >> 32
    data = type("CapData", (_ctypes.Array,), {"_type_": uint32, "_length_": 6})(low, low, 0, high, high, 0)
    check(libc["capset"](header, data), "capset")
    check(libc["prctl"](ulong(PR_SET_NO_NEW_PRIVS), ulong(1), ulong(0), ulong(0), ulong(0)), "no_new_privs")
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    got = {name: int(status[name], 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    if got != {"CapInh": 0, "CapPrm": keep, "CapEff": keep, "CapBnd": keep, "CapAmb": 0} \
            or status.get("NoNewPrivs", "").strip() != "1":
        raise EnterError("could not set the agent's capabilities as bwrap would: %s"
                         % {name: hex(value) for name, value in got.items()})
