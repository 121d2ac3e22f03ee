"""Starting one local sandbox process and waiting until its agent is ready.

The sandbox is started through a few lines of `/bin/sh` that first move the shell into the sandbox's
cgroups (or, without cgroups, set rlimits), so everything after — bwrap, its namespace init, the agent —
is limited from its first instruction; then, in a private mount namespace (`unshare`, so the host never
sees those mounts and they vanish with the sandbox), as root bind the bundle cache read-only onto itself
(LOCK_SCRIPT) and, when `disk_mb` is set, mount the size-limited tmpfs for the writable layer; then exec
bwrap, which reads its arguments from a file descriptor."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Sequence

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local.bwrap import SandboxPaths
from orchard.sandbox.backends.local.cgroups import CgroupSet

log = logging.getLogger(__name__)

HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# Runs in the private mount namespace: $1 size in MiB, $2 the most inodes, $3 the dir to mount on, $4 and
# $5 the subdirectories to create there (space separated; $5 the sticky, world-writable ones like /tmp),
# $6 their owner (uid:gid, or empty), then the command.
DISK_SCRIPT = ('mount -t tmpfs -o "size=${1}m,nr_inodes=$2,mode=0755" orchard-disk "$3" && cd "$3" '
               '&& mkdir $4 && ${5:+mkdir -m 1777 $5} && ${6:+chown $6 . $4 $5} && cd / && shift 6 '
               '&& exec "$@"')
# Runs in the private mount namespace too, first: each argument up to `--` is a host directory that the
# sandbox gets read-only (the agent and harness bundles' cache), bound read-only onto itself. bwrap's user
# namespace copies this namespace, and the kernel locks what it copies read-only ("locked" mount flags):
# no capability inside the sandbox can make those mounts, or bwrap's binds of them, writable again, and
# the bundle's files are owned by host root, whom the sandbox maps (as the uid its agent starts as).
LOCK_SCRIPT = ('while [ "$1" != -- ]; do mount --bind -o ro "$1" "$1" || exit 1; shift; done; shift; '
               'exec "$@"')
# Files the disk tmpfs may hold per MiB: inodes are kernel memory that `size=` does not count.
INODES_PER_MB = 256
MIN_INODES = 4096


def writable_subdirs(rootfs: Path | None) -> tuple[list[str], list[str]]:
    """The writable layer's directories, (plain, sticky 1777): the overlay's (rootfs images), else the
    workspace and the sandbox's /tmp and /run (image `host`), so that every byte the sandbox writes is
    inside it."""
    return (["upper", "work"], []) if rootfs is not None else (["workspace"], ["tmp", "run"])


def launch_argv(bwrap: str, args_fd: int, agent_argv: list[str], spec: SandboxSpec, rootfs: Path | None,
                paths: SandboxPaths, cgroups: CgroupSet | None, owner: str = "",
                read_only: Sequence[Path] = ()) -> list[str]:
    """`owner` (uid:gid on the host): who gets the writable layer's directories made on the disk tmpfs;
    `read_only`: see `launch_command`."""
    lines = ["set -e"]
    if cgroups is not None:
        lines += [f"echo $$ > {shlex.quote(f)}" for f in cgroups.procs_files]
    lines += limit_lines(spec, cgroups)
    lines.append('exec "$@"')
    command = launch_command(bwrap, args_fd, agent_argv, spec, rootfs, paths, owner, read_only)
    return ["/bin/sh", "-c", "\n".join(lines), "orchard-sandbox", *command]


def limit_lines(spec: SandboxSpec, cgroups: CgroupSet | None) -> list[str]:
    """Shell lines for what the cgroups cannot hold: RLIMIT_NPROC in place of a missing pids group."""
    if not spec.max_processes or (cgroups is not None and "pids" in cgroups.controllers):
        return []
    # No pids group: RLIMIT_NPROC stands in, only where it holds (limits.py refuses the rest,
    # and memory_mb/cpu without their groups, before we get here). prlimit, because `ulimit` flags
    # differ between shells.
    prlimit = shutil.which("prlimit", path=HOST_ENV["PATH"])
    if prlimit is None:
        raise BackendError("max_processes without a pids cgroup needs `prlimit` (util-linux)")
    return [f"{prlimit} --pid $$ --nproc={spec.max_processes}"]


def launch_command(bwrap: str, args_fd: int, agent_argv: list[str], spec: SandboxSpec, rootfs: Path | None,
                   paths: SandboxPaths, owner: str = "", read_only: Sequence[Path] = ()) -> list[str]:
    """bwrap with its arguments in `args_fd`, behind `unshare` (a private mount namespace) with the disk
    tmpfs's script (`disk_mb`) and LOCK_SCRIPT (`read_only`: host directories made read-only for good in
    the sandbox; given by the backend as root, whose sandboxes map host root)."""
    command = [bwrap, "--args", str(args_fd), "--", *agent_argv]
    if spec.disk_mb:
        command = ["/bin/sh", "-c", DISK_SCRIPT, "orchard-disk", str(spec.disk_mb),
                   str(max(MIN_INODES, spec.disk_mb * INODES_PER_MB)), str(paths.writable_dir),
                   *(" ".join(d) for d in writable_subdirs(rootfs)), owner, *command]
    if read_only:
        command = ["/bin/sh", "-c", LOCK_SCRIPT, "orchard-lock", *map(str, read_only), "--", *command]
    if spec.disk_mb or read_only:
        unshare = shutil.which("unshare", path=HOST_ENV["PATH"])
        if unshare is None:
            raise BackendError("the local backend needs `unshare` (util-linux) for disk_mb and, as root, to "
                               "keep the agent bundle read-only in sandboxes; install util-linux")
        command = [unshare, "--mount", "--propagation", "private", *command]
    return command


def memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)  # the child shares this offset: bwrap must read from the start
    except BaseException:
        os.close(fd)
        raise
    return fd


def spawn(make_argv: Callable[[int], list[str]],
          make_bwrap_args: Callable[[int, int, int | None, int], list[str]],
          paths: SandboxPaths, token: str, listen_fd: int, workload_env: bytes = b"",
          block_userns: bool = False, keep_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen, int, int | None]:
    """Start the sandbox; returns the process (bwrap's monitor once the shell has exec'd), the read end of
    bwrap's info pipe and, with `block_userns`, the write end of the pipe bwrap waits on until the user
    namespace's id maps are written (`release_userns`). The makers get the fd numbers (bwrap's
    arguments; info pipe, token, userns pipe, workload env) the child will see. Arguments, token and the
    workload's environment (`workload_env`, encoded) are handed over in anonymous memory files: nothing
    to create, reopen and unlink, and no secret of the spec's env on disk. `listen_fd` (the agent's
    listening socket) and `keep_fds` are passed on at their own numbers."""
    info_r, info_w = os.pipe()
    child_fds = [info_w]
    block_r = block_w = None
    if block_userns:
        block_r, block_w = os.pipe()
        os.set_inheritable(block_w, False)
        child_fds.append(block_r)
    try:
        token_fd = memfd("orchard-token", token.encode())
        child_fds.append(token_fd)
        env_fd = memfd("orchard-workload-env", workload_env)
        child_fds.append(env_fd)
        args_fd = memfd("orchard-bwrap-args", b"".join(
            a.encode() + b"\x00" for a in make_bwrap_args(info_w, token_fd, block_r, env_fd)))
        child_fds.append(args_fd)
        log_fd = os.open(paths.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        child_fds.append(log_fd)
        proc = subprocess.Popen(make_argv(args_fd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=log_fd, start_new_session=True, env=HOST_ENV,
                                pass_fds=(args_fd, info_w, token_fd, env_fd, listen_fd, *keep_fds,
                                          *([block_r] if block_r is not None else [])))
    except BaseException as e:
        os.close(info_r)
        if block_w is not None:
            os.close(block_w)
        if isinstance(e, OSError):
            raise BackendError(f"could not start bubblewrap: {e}") from e
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    return proc, info_r, block_w


def release_userns(child_pid: int, block_w: int, id_map: str) -> None:
    """Write the id maps of bwrap's new user namespace (its child `child_pid`), then let bwrap go on.
    Closes `block_w` in every case: without maps, bwrap fails on its own and says so."""
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child_pid}/{name}", "w") as f:
                f.write(id_map)
        os.write(block_w, b"1")
    except OSError as e:
        raise BackendError(f"could not map the sandbox's user ids ({e}); the orchestrator must run as "
                           "root on a kernel with user namespaces") from e
    finally:
        os.close(block_w)


async def wait_ready_line(proc: subprocess.Popen, timeout: float) -> str:
    """The agent's `READY <address>` line; raises TimeoutError, or BackendError when stdout closed first."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), proc.stdout)
    try:
        while True:
            line = (await asyncio.wait_for(reader.readline(), timeout)).decode(errors="replace")
            if not line:
                raise BackendError("the sandbox exited before its agent was ready")
            if line.startswith("READY"):
                return line.strip()
    finally:
        # The agent writes nothing after READY; closing our end keeps no fd per sandbox.
        transport.close()


async def read_info(info_r: int, timeout: float) -> dict:
    """bwrap's `--info-fd` report (has `child-pid`), taken as soon as it is complete: bwrap writes it right
    after making the sandbox's namespaces, long before the agent is up. {} when bwrap exits without writing
    it. Closes `info_r`."""
    loop = asyncio.get_running_loop()
    complete = loop.create_future()
    data = bytearray()

    def on_readable() -> None:
        try:
            while chunk := os.read(info_r, 65536):
                data.extend(chunk)
        except BlockingIOError:
            if not _parse_info(data):
                return  # more to come
        except OSError:
            pass  # unreadable: as if bwrap wrote nothing more
        if not complete.done():  # the report is complete, or bwrap closed the pipe (EOF)
            complete.set_result(None)

    os.set_blocking(info_r, False)
    loop.add_reader(info_r, on_readable)
    try:
        await asyncio.wait_for(complete, timeout)
    finally:
        loop.remove_reader(info_r)
        os.close(info_r)
    return _parse_info(data)


def _parse_info(data: bytes) -> dict:
    try:
        info = json.loads(data) if data.rstrip().endswith(b"}") else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


WORKLOAD_INIT_NAME = "orchard-init"
_init_protection_warned = False


def _thread_children(pid: int) -> list[int]:
    """Children of every thread of `pid` (/proc/PID/task/*/children), [] when it is gone."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(child) for child in f.read().split()]
        except OSError:
            continue
    return found


def protect_workload_init(sandbox_init_pid: int, agent_pid: int | None = None) -> bool:
    """Exempt the init of the workload's pid namespace (the agent's child named orchard-init, see the
    agent's pidns.py) from the OOM killer: oom_score_adj -1000, which only a holder of CAP_SYS_RESOURCE
    over the host (the backend as root) may set. It never forks, so nothing inherits it, and its /proc
    files are another uid's than the workload's, so the workload cannot raise it again. Killing it would
    kill every process of the workload and end the agent. False when there is no such init (the agent
    could not separate its commands) or the setting failed (without CAP_SYS_RESOURCE, as in a container
    that drops it: logged once per process, since every sandbox of this process meets the same)."""
    global _init_protection_warned
    for agent in [agent_pid] if agent_pid else _thread_children(sandbox_init_pid):
        for child in _thread_children(agent):
            try:
                with open(f"/proc/{child}/comm") as f:
                    if f.read().strip() != WORKLOAD_INIT_NAME:
                        continue
                exempt_from_oom_killer(child)
                return True
            except OSError as e:
                if not _init_protection_warned:
                    _init_protection_warned = True
                    log.warning(
                        "sandboxes of this process run without their init exempt from the OOM killer (%s: "
                        "lowering oom_score_adj needs CAP_SYS_RESOURCE, which containers often drop). What it "
                        "means: a sandbox that fills its memory still loses one of its commands first (theirs "
                        "is raised), but should the OOM killer ever pick its init, every process of that "
                        "sandbox ends and the sandbox is lost. Give the orchestrator CAP_SYS_RESOURCE to "
                        "exempt it; this is said once per process", e.strerror or e)
                return False
    return False


def exempt_from_oom_killer(pid: int) -> None:
    """oom_score_adj -1000 for `pid`; OSError (EACCES) without CAP_SYS_RESOURCE."""
    with open(f"/proc/{pid}/oom_score_adj", "w") as f:
        f.write("-1000")
