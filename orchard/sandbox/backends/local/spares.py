"""Spares: a sandbox's cgroups made before its create, with the processes that start it already in them.

A create's first move into its cgroups (a write to `cgroup.procs`) waits for an RCU grace period unless
another move happened on the host just before it (docs/local-backend.md#start-path): ~8 ms on a 2-core
Xeon with cgroup v1, a quarter of a create. A spare takes every move off the create. Made while no create
waits, it is a set of groups (no limits yet) holding
  - a `/bin/sh` that has moved itself in and waits on its stdin for the lines that exec bwrap, with the
    descriptors bwrap gets (its info pipe, the user namespace's pipe, the token, workload env and argument
    memory files, the pipe its init blocks on) passed to it already, and
  - a child of the agent zygote parked in them (the agent's zygote.py `_start`), waiting for the request
    that makes it start the agent.
A create that takes one renames the groups to its sandbox's key (cgroup v1 renames a group with everything
in it), writes the spec's limits into them and sends the shell its lines: bwrap starts from a process that
is in the cgroups already, and the agent is forked from one that is too. Spares go with the zygote (root)
on cgroup v1; cgroup2 cannot rename a group, and creates there move their processes as before.

A spare the backend gives up (its close, a restarted zygote) is killed with its groups. One whose backend
died ends by itself (its shell and its parked child read end of file) and the next start's sweep of
abandoned groups removes its then-empty groups."""

from __future__ import annotations

import logging
import os
import secrets
import select
import shlex
import signal
import socket
import subprocess
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxSpec
import orchard.sandbox.backends.local.cgroups as cgroups
from orchard.sandbox.backends.local.cgroups import CgroupSet
from orchard.sandbox.backends.local.launch import HOST_ENV
from orchard.sandbox.backends.local.procs import never_readable_fd
from orchard.sandbox.backends.local.zygote import Zygote

log = logging.getLogger(__name__)

SPARE_INFIX = "spare-"  # a spare's key: <owner>-spare-<12 hex>, so the owner's sweep covers orphans
READY_TIMEOUT_S = 10.0
MAX_FAILURES = 3  # spares in a row that could not be made before the backend stops trying
# How long after a create its successor's spare is begun: the caller is still busy with the create then
# (its record, its answer), and the spare's making would share the CPU with that.
FILL_DELAY_S = 0.03
# The spare's shell: into the groups, say so, then run what comes on stdin (end of file: nothing, exit).
SHELL = "set -e\n{moves}\necho spare\n. /dev/stdin\nexit 0\n"
# A spare's groups hold no limit until a create writes its spec's (a spec without one must find none).
NO_LIMITS = SandboxSpec(max_processes=None)


@dataclass
class Spare:
    """One spare; the numbers are those of the descriptors in the shell (ours have the same)."""

    key: str
    groups: CgroupSet
    zygote: Zygote
    proc: subprocess.Popen  # the shell, in the groups; becomes bwrap
    parked: socket.socket  # to the zygote's child parked in the groups
    script_w: int  # the shell's stdin
    info_r: int  # bwrap's --info-fd, read end
    block_w: int  # what bwrap waits on until the user namespace's id maps are written
    token_fd: int  # memory files, written at launch (the shell shares their offsets)
    args_fd: int
    env_fd: int  # the workload's environment (bwrap.WORKLOAD_ENV_FILE)
    info_number: int
    block_number: int
    hold_number: int  # the pipe bwrap's init blocks on (it holds a write end: never readable)

    def usable_with(self, zygote: Zygote) -> bool:
        """Its shell and its parked child are there, and the child is the running zygote's."""
        if self.zygote is not zygote or not zygote.alive() or self.proc.poll() is not None:
            return False
        gone, _, _ = select.select([self.parked], [], [], 0)  # the child sends nothing more: end of file
        return not gone

    def launch(self, bwrap_args: list[str], command: list[str], limit_lines: list[str], log_file: Path,
               token: str, workload_env: bytes = b"") -> tuple[subprocess.Popen, int, int]:
        """Have the shell exec `command` (bwrap, arguments in `bwrap_args`), its stderr to `log_file`;
        returns what `launch.spawn` does: (the process, bwrap's info pipe, the user namespace's
        pipe), which the caller owns from then on."""
        for fd, data in ((self.token_fd, token.encode()), (self.env_fd, workload_env),
                         (self.args_fd, b"".join(a.encode() + b"\x00" for a in bwrap_args))):
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)  # the shell shares this offset: bwrap must read from the start
        os.close(os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        lines = [f"exec </dev/null 2>>{shlex.quote(str(log_file))}", *limit_lines,
                 "exec " + " ".join(map(shlex.quote, command))]
        try:
            os.write(self.script_w, ("\n".join(lines) + "\n").encode())
        except OSError as e:
            raise BackendError(f"could not start bubblewrap from a spare: {e}") from e
        finally:
            self.close_fds(keep=(self.info_r, self.block_w))
        info_r, block_w, self.info_r, self.block_w = self.info_r, self.block_w, -1, -1
        return self.proc, info_r, block_w

    def close_fds(self, keep: tuple[int, ...] = ()) -> None:
        """Close what we hold of it but `keep` (the parked child's socket too, unless kept)."""
        for name in ("script_w", "info_r", "block_w", "token_fd", "args_fd", "env_fd"):
            fd = getattr(self, name)
            if fd >= 0 and fd not in keep:
                os.close(fd)
                setattr(self, name, -1)
        if not keep:
            self.parked.close()

    def discard(self) -> None:
        """Kill its processes, remove its groups, close what we hold."""
        self.close_fds()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        cgroups.kill_and_remove(self.groups.paths)


def make_spare(key: str, zygote: Zygote) -> Spare | None:
    """A spare under `key`, or None where there can be none (no cgroups, or cgroup2's). BackendError when
    its shell or the zygote's child did not join its groups."""
    groups = cgroups.create_cgroups(key, NO_LIMITS, split=True)
    if groups is None:
        return None
    if any(version != 1 for version in groups.version.values()):
        cgroups.remove_cgroups(groups.paths)
        return None
    ours: list[int] = []  # closed on failure
    theirs: list[int] = []  # the shell's (closed here once it has them)
    proc = parked = None
    try:
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        script_r, script_w = os.pipe()
        ours += [info_r, block_w, script_w]
        theirs += [info_w, block_r, script_r]
        token_fd, args_fd = os.memfd_create("orchard-token"), os.memfd_create("orchard-bwrap-args")
        ours += [token_fd, args_fd]
        env_fd = os.memfd_create("orchard-workload-env")
        ours.append(env_fd)
        hold = never_readable_fd()
        theirs.append(hold)
        moves = "\n".join(f"echo $$ > {shlex.quote(f)}" for f in groups.procs_files)
        proc = subprocess.Popen(["/bin/sh", "-c", SHELL.format(moves=moves), "orchard-sandbox"],
                                stdin=script_r, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, env=HOST_ENV,
                                pass_fds=(info_w, block_r, token_fd, args_fd, env_fd, hold))
        for fd in theirs:
            os.close(fd)
        theirs = []
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
        if not ready or proc.stdout.readline() != b"spare\n":
            raise BackendError("a spare's shell did not join its cgroups")
        parked = zygote.park(groups.procs_files)
        return Spare(key=key, groups=groups, zygote=zygote, proc=proc, parked=parked, script_w=script_w,
                     info_r=info_r, block_w=block_w, token_fd=token_fd, args_fd=args_fd, env_fd=env_fd,
                     info_number=info_w, block_number=block_r, hold_number=hold)
    except BaseException:
        for fd in ours + theirs:
            os.close(fd)
        if proc is not None:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        cgroups.kill_and_remove(groups.paths)
        raise


class SpareReserve:
    """Up to `count` spares of one backend (`owner`, its key prefix): made on a thread of their own when
    asked (`fill`, after each create; begun FILL_DELAY_S later), taken by creates (`take`). Those of a
    backend never closed are discarded when it is collected or the interpreter exits: their processes would
    end by themselves (end of file) but leave their groups, which only a later backend on the same
    directories would sweep."""

    def __init__(self, count: int, owner: str) -> None:
        self.count, self.owner = count, owner
        self._ready: list[Spare] = []
        self._making: str | None = None  # the key of the spare being made
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = threading.Event()  # close() ends the delay before a spare is made
        self._failures = 0
        self.off_reason: str | None = None if count > 0 else "spares: 0"
        self._discard_ready = weakref.finalize(self, _discard_all, self._ready, self._lock)

    def take(self, zygote: Zygote) -> Spare | None:
        """A ready spare of `zygote` (those of another, or whose processes are gone, are discarded)."""
        stale = []
        with self._lock:
            found = None
            while self._ready and found is None:
                spare = self._ready.pop()
                if spare.usable_with(zygote):
                    found = spare
                else:
                    stale.append(spare)
        for spare in stale:
            spare.discard()
        return found

    def fill(self, zygote: Zygote) -> None:
        """Make spares up to `count` on a thread, unless that thread runs already."""
        with self._lock:
            if self.off_reason or self._closed or len(self._ready) >= self.count:
                return
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._fill, args=(zygote,), name="orchard-spares", daemon=True)
            self._thread.start()

    def names(self) -> set[str]:
        """The keys of the spares made or being made (their groups are not abandoned)."""
        with self._lock:
            return {spare.key for spare in self._ready} | ({self._making} if self._making else set())

    def _fill(self, zygote: Zygote) -> None:
        if self._stopping.wait(FILL_DELAY_S):
            return
        while True:
            key = f"{self.owner}-{SPARE_INFIX}{secrets.token_hex(6)}"
            with self._lock:
                if self._closed or len(self._ready) >= self.count:
                    return
                self._making = key
            try:
                spare = make_spare(key, zygote)
            except (BackendError, OSError) as e:
                self._failures += 1
                log.warning("could not make a spare for the next create (%s)%s", e,
                            "; creates go without spares from now on" if self._failures >= MAX_FAILURES else "")
                if self._failures >= MAX_FAILURES:
                    self.off_reason = f"spares failed {MAX_FAILURES} times in a row: {e}"
                return
            finally:
                with self._lock:
                    self._making = None
            if spare is None:
                self.off_reason = "no cgroup v1 groups to rename here"
                return
            self._failures = 0
            with self._lock:
                if not self._closed:
                    self._ready.append(spare)
                    continue
            spare.discard()
            return

    def close(self) -> None:
        """Stop making spares and discard those made."""
        with self._lock:
            self._closed = True
            self._stopping.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=READY_TIMEOUT_S + 5)
        self._discard_ready()


def _discard_all(ready: list[Spare], lock: threading.Lock) -> None:
    with lock:
        spares = list(ready)
        ready.clear()
    for spare in spares:
        spare.discard()
