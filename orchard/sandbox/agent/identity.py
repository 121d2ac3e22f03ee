"""Who the agent and the commands it runs are (`--user`, `--agent-user`; Linux only).

`--user UID:GID` alone: the agent becomes that user, with no supplementary groups, and drops every
capability, bounding set included, before it serves: it and its commands are that user, with no way back.

With `--agent-user A_UID:A_GID` as well, the agent keeps an identity of its own that its commands cannot
signal, trace or read (/proc/<agent>/mem): it becomes A, keeping only CAP_SETUID, CAP_SETGID (to start
commands as UID:GID) and CAP_KILL (to stop them); its bounding set is emptied, so no command can ever
gain a capability; and its file system uid and gid are UID:GID, so files it reads and writes for clients
are checked and owned as the commands' own would be. Both start from the capabilities CAP_SETUID,
CAP_SETGID, CAP_SETPCAP (and CAP_KILL for the split), as the local backend starts the agent (which also
gives CAP_SYS_ADMIN, for pidns.py, dropped here with the rest).

Every step is checked in /proc/self/status (/proc/thread-self/status for a thread: `thread_only`); any
failure ends the agent (exit status 2)."""

from __future__ import annotations

import os

from . import own_proc

# Keyword arguments of subprocess.Popen for every command and shell: who they run as (empty: as the agent).
CHILD = {}

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 5, 6, 7, 8
AGENT_CAPS = (1 << CAP_KILL) | (1 << CAP_SETGID) | (1 << CAP_SETUID)


class IdentityError(Exception):
    pass


def parse_ids(text: str, option: str):
    uid, _, gid = text.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise IdentityError("%s must be UID:GID, not %r" % (option, text))


def _libc(names=("prctl", "capset", "setfsuid", "setfsgid")):
    """Functions of the C library (by default prctl, capset, setfsuid and setfsgid), through `_ctypes`
    alone: `import ctypes` costs every sandbox start several milliseconds, these few lines about one.
    Arguments are passed as C ints unless wrapped (`ulong`); bytes as `char *`, None as NULL."""
    import _ctypes

    class c_int(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int

    handle = _ctypes.dlopen(None, 0)
    return {name: Function(_ctypes.dlsym(handle, name))
            for name in names}, _ctypes


def ulong_type():
    import _ctypes

    class ulong(_ctypes._SimpleCData):
        _type_ = "L"

    return ulong


def take_fsuid(uid: int):
    """The calling thread's file system uid becomes `uid`, one of its own uids (no capability needed);
    raises IdentityError when it did not (the previous fsuid is what setfsuid answers)."""
    libc, _ctypes = _libc(("setfsuid",))
    libc["setfsuid"](uid)
    now = libc["setfsuid"](uid)
    if now != uid:
        raise IdentityError("could not set the file system uid to %d (it is %d)" % (uid, now))


def _status(which: str = "self/status") -> dict:
    with own_proc.open_proc(which) as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def become(user: str, agent_user: str = None, thread_only: bool = False, fsuid: int = None):
    """See the module's docstring. Must run before any thread starts (the uid changes are per process,
    the file system ids are inherited by threads started afterwards). `thread_only`: in a thread started
    before (pidns.py's spawner), once the main thread has become the user: capabilities, bounding set and
    file system ids are per thread, so such a thread sets its own the same way. `fsuid` (with
    `thread_only`, no `agent_user`): the file system uid that thread keeps instead of the user's (pidns.py
    `PROC_FSUID`: with no capability, it only opens files that uid owns)."""
    uid, gid = parse_ids(user, "--user")
    own_uid, own_gid = parse_ids(agent_user, "--agent-user") if agent_user else (uid, gid)
    libc, _ctypes = _libc()
    ulong = ulong_type()

    class uint32(_ctypes._SimpleCData):
        _type_ = "I"

    header_type = type("CapHeader", (_ctypes.Array,), {"_type_": uint32, "_length_": 2})
    data_type = type("CapData", (_ctypes.Array,), {"_type_": uint32, "_length_": 6})

    def check(result, what):
        if result != 0:
            raise IdentityError("%s failed: %s" % (what, os.strerror(_ctypes.get_errno())))

    def capset(mask: int):
        low, high = mask & 0xFFFFFFFF, mask >> 32  # effective, permitted, inheritable; low words first
        header = header_type(LINUX_CAPABILITY_VERSION_3, 0)
        check(libc["capset"](header, data_type(low, low, 0, high, high, 0)), "capset")

    try:
        if not thread_only:  # (the C library applies these to every thread of the process)
            os.setgroups([])
            os.setresgid(own_gid, own_gid, own_gid)
            os.setresuid(own_uid, own_uid, own_uid)
    except OSError as exc:
        raise IdentityError("cannot become uid %d gid %d: %s (the agent needs CAP_SETUID and CAP_SETGID)"
                            % (own_uid, own_gid, exc.strerror))
    keep = AGENT_CAPS if agent_user else 0
    if fsuid is not None and not agent_user:
        libc["setfsuid"](fsuid)  # while CAP_SETUID is still there; checked below
    if agent_user:  # (no uid 0 was involved, so the kernel left the capabilities as they were)
        capset(keep | (1 << CAP_SETPCAP))
    cap = 0
    while libc["prctl"](ulong(PR_CAPBSET_DROP), ulong(cap), ulong(0), ulong(0), ulong(0)) == 0:
        cap += 1  # EINVAL past the last capability the kernel knows
    check(libc["prctl"](ulong(PR_CAP_AMBIENT), ulong(PR_CAP_AMBIENT_CLEAR_ALL), ulong(0), ulong(0), ulong(0)),
          "clearing the ambient capabilities")
    capset(keep)
    if agent_user:
        libc["setfsgid"](gid)
        libc["setfsuid"](uid)
        CHILD.update(user=uid, group=gid, extra_groups=[])
    status = _status("thread-self/status" if thread_only else "self/status")
    caps = {name: int(status[name], 16) for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    expected = {"CapInh": 0, "CapPrm": keep, "CapEff": keep, "CapBnd": 0, "CapAmb": 0}
    kept_fsuid = fsuid if fsuid is not None and not agent_user else uid
    ids_ok = (status["Uid"].split() == [str(own_uid)] * 3 + [str(kept_fsuid)]
              and status["Gid"].split() == [str(own_gid)] * 3 + [str(gid)] and not os.getgroups())
    if caps != expected or not ids_ok:
        raise IdentityError("could not set the agent's identity: ids %s / %s, capabilities %s (expected "
                            "%s); the agent needs CAP_SETUID, CAP_SETGID and CAP_SETPCAP"
                            % (status["Uid"], status["Gid"], {k: hex(v) for k, v in caps.items()},
                               {k: hex(v) for k, v in expected.items()}))
