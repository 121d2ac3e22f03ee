"""The workload's own pid namespace, in which the agent has no pid (Linux; `--user` with CAP_SYS_ADMIN).

Sharing the workload's uid, the agent could be stopped or killed by it (`kill -STOP`, `kill -9 -1`).
So before it drops its capabilities the agent makes a new pid namespace, child of its own, for every
process it starts from then on (commands, shells). A pid is looked up in the caller's namespace, so from
the workload's side the agent has no pid at all: kill(2), kill(-1) (which skips processes without a pid
in the caller's namespace), ptrace, pidfd_open and pidfd_send_signal cannot name it, and it is not in
the workload's /proc. The agent still sees and signals its commands (its namespace is the parent), and
their uid does not change, so they still start with vfork.

unshare(CLONE_NEWPID) only sets where the *calling thread's* children go, and the kernel then refuses
that thread any new thread (clone with CLONE_THREAD fails with EINVAL once the thread's children's
namespace is not its own). So one thread, the spawner (`_Spawner`), does the unshare and from then on
starts every process (`popen`); the threaded server stays in the agent's namespace. The hand-over costs
a few microseconds per command. Capabilities and file system ids being per thread, the spawner drops
its own the way the main thread does (`finish`, after `identity.become`).

The first process the spawner forks is the new namespace's init (pid 1): this module's `_init`. It
  - mounts a /proc of the new namespace over /proc (the mount namespace is the agent's and the
    workload's alike), so the workload's pids, `$$`, /proc/self and `ps`/`pkill` agree, and the agent is
    not in it at all (bwrap's read-only covers of /proc/sys, /proc/sysrq-trigger, /proc/irq and
    /proc/bus are made again on it); the agent keeps its own /proc open (own_proc.py) for its own status
    and its process-group lookups;
  - closes every descriptor of the agent's (the listening socket; stdin and stdout, the READY pipe,
    become /dev/null; stderr, the agent's log, stays), becomes `--init-user` (by
    default the commands' user) with every capability dropped, bounding set included, makes itself
    dumpable again under that uid when it is not the commands' own (its /proc files, oom_score_adj
    included, are then that uid's, not the workload's; it never dumps core), sets PR_SET_PDEATHSIG
    (SIGKILL) and reaps orphans forever. As a namespace's init it gets no signal from inside that it
    has no handler for (it has none), and kill(-1) skips it.

When the init dies, the kernel kills the whole namespace and no process can be created in it again
(fork fails with ENOMEM): the agent then exits, saying so on stderr, so that its sandbox is seen as lost
instead of answering errors forever.

Where unshare is refused (no CAP_SYS_ADMIN: containers, a non-root local backend), or any step of the
init's set-up fails, the agent goes on as before, starting its commands itself in its own namespace
(`SEPARATE` stays False, the spawner thread is gone, and /health says `"workload_pid_namespace":
"shared"`), after saying why on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from . import identity, own_proc

CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NAME = 1, 4, 15
PROC_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
# What bwrap makes read-only on the /proc it mounts (bubblewrap.c, cover_proc_dirs).
PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")
INIT_NAME = b"orchard-init"

SEPARATE = False  # the workload runs in a pid namespace of its own
INIT_PID = None  # its init, as the agent sees it
# The file system uid the spawner thread keeps instead of the commands' (None: theirs), see `finish`.
PROC_FSUID = None


def health() -> str:
    return "separate" if SEPARATE else "shared"


def separate(user: str, init_user: str = None):
    """Start the spawner thread, which makes the workload's namespace and its init while the agent goes on
    starting (importing its server). Must run before any other thread starts; then `forked` before
    `identity.become` drops CAP_SYS_ADMIN, and `finish` after it."""
    global _spawner
    own_uid = (bool(init_user)
               and identity.parse_ids(init_user, "--init-user") != identity.parse_ids(user, "--user"))
    _spawner = _Spawner(init_user or user, own_uid)


def forked():
    """Wait until the namespace exists and its init is forked (its own set-up goes on in parallel); None
    when so, else why not (the agent then goes on as before, the spawner gone)."""
    return _give_up_unless(lambda spawner: spawner.forked)


def finish(user: str, agent_user: str = None, spawners: bool = False):
    """After the main thread's `identity.become`: wait for the init's set-up (None, else why it failed:
    the agent then goes on as before), then the spawner drops its own capabilities and sets its file system
    ids the same way (they are per thread). Raises what that raised.

    One exception: where the agent's /proc files (and so those of every process it forks, the workload's
    spawners included) belong to another uid than the commands' one, the spawner thread keeps that uid as
    its file system uid (`PROC_FSUID`), with no capability. That is an agent the zygote forked: its memory
    map was made by an exec on the host, so a non-dumpable process of it is owned by the host's root
    (uid 65535 here), not by the sandbox's. A spawner forked from that thread can then open its own
    oom_score_adj (workload_cgroup.py) before it takes the commands' uid for good. Only with `spawners`
    (the workload's cgroup descriptors were given); and a command the thread starts itself (`popen`)
    makes it take the commands' file system uid for good first."""
    global PROC_FSUID
    why_not = _give_up_unless(lambda spawner: spawner.ready)
    if why_not is None and _spawner is not None:
        owner = os.stat("self/oom_score_adj", dir_fd=own_proc.FD).st_uid  # non-dumpable since become()
        uid, _ = identity.parse_ids(user, "--user")
        fsuid = owner if owner != uid and spawners and not agent_user else None
        _spawner.run(lambda: identity.become(user, agent_user, thread_only=True, fsuid=fsuid))
        PROC_FSUID = fsuid
    return why_not


def _give_up_unless(step):
    """Wait for `step` of the spawner's set-up; if it failed, forget the spawner (its thread has ended)."""
    global _spawner
    if _spawner is None:
        return None
    lock = step(_spawner)
    lock.acquire()
    lock.release()
    if _spawner.error is None:
        return None
    _spawner.thread.join()
    why_not, _spawner = _text(_spawner.error), None
    return why_not


_spawner = None


def popen(*args, **kwargs):
    """subprocess.Popen, in the workload's namespace when there is one (see `_Spawner`)."""
    if _spawner is None:
        return subprocess.Popen(*args, **kwargs)
    return _spawner.run(lambda: _as_commands(subprocess.Popen, *args, **kwargs))


def _as_commands(start, *args, **kwargs):
    """On the spawner thread: `start`, with the commands' file system uid (a child inherits the thread's
    until its exec: its chdir and the exec's own checks must be the commands')."""
    global PROC_FSUID
    if PROC_FSUID is not None:
        identity.take_fsuid(os.getuid())
        PROC_FSUID = None
    return start(*args, **kwargs)


class _Spawner:
    """The one thread that starts processes in the workload's namespace (see the module's docstring).
    Requests hand it a job and wait on a lock: a thread switch per command (~6 us median measured)."""

    def __init__(self, init_user: str, own_uid: bool):
        import _thread
        import threading
        from _queue import SimpleQueue  # the C type itself: queue.py's import is not needed

        self.jobs = SimpleQueue()
        self.error = None
        self.forked, self.ready = _thread.allocate_lock(), _thread.allocate_lock()
        self.forked.acquire()
        self.ready.acquire()
        self.thread = threading.Thread(target=self._main, args=(init_user, own_uid), name="spawner",
                                       daemon=True)
        self.thread.start()

    def run(self, job):
        import _thread

        done = _thread.allocate_lock()
        done.acquire()
        box = [job, done, None, None]
        self.jobs.put(box)
        done.acquire()
        if box[3] is not None:
            raise box[3]
        return box[2]

    def _main(self, init_user: str, own_uid: bool):
        try:
            self._setup(init_user, own_uid)
        except BaseException as exc:
            self.error = exc
            if self.forked.locked():  # failed before the fork (else released already)
                self.forked.release()
            self.ready.release()
            return  # this thread's children's namespace dies with it: nothing else used it
        self.ready.release()
        while True:
            box = self.jobs.get()
            try:
                box[2] = box[0]()
            except BaseException as exc:
                box[3] = exc
            box[1].release()

    def _setup(self, init_user: str, own_uid: bool):
        global SEPARATE, INIT_PID
        # What the init needs, imported before the fork (identity and own_proc at the top, these here): forked
        # while the main thread may be importing, the child must find its modules loaded, never half-imported
        # under another thread's lock.
        import gc  # noqa: F401
        import resource  # noqa: F401

        libc, _ctypes = identity._libc(("unshare",))
        if libc["unshare"](CLONE_NEWPID) != 0:
            raise OSError("unshare(CLONE_NEWPID): %s" % os.strerror(_ctypes.get_errno()))
        # The agent's own /proc, kept open: the init mounts the workload's over /proc while the main thread
        # may be reading its own status (identity.become), so every agent read goes through this from now.
        own_proc.FD = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pid 1 of the new namespace
            try:
                _init(init_user, own_uid, ready_w)
            finally:
                os._exit(1)
        os.close(ready_w)
        self.forked.release()
        with os.fdopen(ready_r, "rb") as ready:
            answer = ready.read(4096)
        if answer != b"ok":
            os.waitpid(pid, 0)
            raise OSError("the init failed: %s" % (answer.decode("utf-8", "replace") or "no answer"))
        SEPARATE, INIT_PID = True, pid


def _init(user: str, own_uid: bool, ready_w: int):
    """pid 1 of the workload's namespace: set up (see the module's docstring), say `ok` on `ready_w`
    (or why not, and exit), then reap orphans until the namespace ends. Never returns."""
    import gc
    import resource

    own_proc.FD = None  # the agent's /proc, closed below: the init reads the /proc it mounts (where it is pid 1)
    gc.disable()  # touches every object of the agent's copied heap: pages this process need not own
    try:
        os.closerange(3, ready_w)
        os.closerange(ready_w + 1, os.sysconf("SC_OPEN_MAX"))
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # the agent's stdout is the READY pipe to the backend
        os.close(null)
        libc, _ctypes = identity._libc(("mount", "prctl"))
        ulong = identity.ulong_type()

        def mount(source, target, fstype, flags):
            if libc["mount"](source, target, fstype, ulong(flags), None) != 0:
                raise OSError("mount %s on %s: %s" % (source.decode(), target.decode(),
                                                      os.strerror(_ctypes.get_errno())))

        mount(b"proc", b"/proc", b"proc", PROC_FLAGS)
        for name in PROC_COVERS:
            path = b"/proc/" + name.encode()
            if not os.path.exists(path):
                continue
            mount(path, path, None, MS_BIND | MS_REC)
            mount(path, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | PROC_FLAGS)
        libc["prctl"](ulong(PR_SET_NAME), INIT_NAME, ulong(0), ulong(0), ulong(0))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        identity.become(user)
        if own_uid:
            # Under a uid of its own, dumpable only means: its /proc files are that uid's (the workload
            # cannot raise its oom_score_adj); ptrace and /proc/1/mem still need that uid.
            if libc["prctl"](ulong(PR_SET_DUMPABLE), ulong(1), ulong(0), ulong(0), ulong(0)) != 0:
                raise OSError("PR_SET_DUMPABLE: %s" % os.strerror(_ctypes.get_errno()))
        # Set last: a change of credentials clears it. The agent is still there (we write to it below).
        if libc["prctl"](ulong(PR_SET_PDEATHSIG), ulong(signal.SIGKILL), ulong(0), ulong(0), ulong(0)) != 0:
            raise OSError("PR_SET_PDEATHSIG: %s" % os.strerror(_ctypes.get_errno()))
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)  # no handler: the namespace's init then ignores it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        os.write(ready_w, b"ok")
        os.close(ready_w)
    except BaseException as exc:
        try:
            os.write(ready_w, _text(exc).encode("utf-8", "replace")[:4000])
        finally:
            os._exit(1)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        signal.sigwait({signal.SIGCHLD})  # blocked, so one arriving since the waitpid is pending


def _text(exc: BaseException) -> str:
    """What happened: the exception's message, or its type's name when the message is empty."""
    return str(exc).strip() or type(exc).__name__


def watch_init():
    """Once serving: a thread that ends the agent when the workload's init dies (nothing can start in its
    namespace any more)."""
    if INIT_PID is None:
        return
    import threading

    def wait():
        _, status = os.waitpid(INIT_PID, 0)
        sys.stderr.write("orchard-agent: the workload's pid namespace init (pid %d) ended (wait status "
                         "%d); no command can start in that namespace any more, so the agent exits\n"
                         % (INIT_PID, status))
        sys.stderr.flush()
        os._exit(3)

    threading.Thread(target=wait, name="init-watch", daemon=True).start()


def init_alive() -> bool:
    """Whether the workload's init still runs (False when there is none)."""
    if INIT_PID is None:
        return False
    try:
        with own_proc.open_proc("%d/stat" % INIT_PID, "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def spawn_hint() -> str:
    """Why starting a process may have failed, for the error a client gets."""
    if INIT_PID is not None and not init_alive():
        return ("the init of the commands' pid namespace has died, so nothing can start in it any more; "
                "the agent is exiting and the sandbox is lost")
    return "is the sandbox out of processes or memory?"
