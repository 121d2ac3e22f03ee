"""bubblewrap alone: `bwrap` with the arguments a default local sandbox gets (the same binds, namespaces,
user id map and capabilities) running `true`, timed from spawn to exit. It is the floor of the local
backend's create→ready: what the namespaces and mounts cost with no agent, no cgroups and no bookkeeping."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local.bwrap import (REMAP_BASE, SandboxPaths, bwrap_args, id_map, agent_env,
                                                  remaps_ids)
from orchard.sandbox.backends.local.backend import MOUNT_RACE_ATTEMPTS, MOUNT_RACE_MESSAGES, LocalBackend
from orchard.sandbox.backends.local.launch import HOST_ENV, writable_subdirs
from orchard.sandbox.bubblewrap import find_bwrap
from orchard.sandbox.bundle import AgentBundle


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_child_pid(info_r: int) -> int:
    data = b""
    while not data.rstrip().endswith(b"}"):
        chunk = os.read(info_r, 65536)
        if not chunk:
            return 0
        data += chunk
    return int(json.loads(data).get("child-pid") or 0)


def time_bwrap_true(bundle: AgentBundle, spec: SandboxSpec | None = None) -> float:
    """Seconds from spawning bwrap (arguments through a memory file, as the backend passes them) until
    `true` inside it has exited. As root, the user namespace's id maps are written while bwrap waits, as
    the backend does. A run that lost the race with a host mount coming or going under a bound directory
    (which the backend retries too) is run again."""
    for attempt in range(1, MOUNT_RACE_ATTEMPTS + 1):
        try:
            return _time_once(bundle, spec or SandboxSpec())
        except _MountRace:
            if attempt == MOUNT_RACE_ATTEMPTS:
                raise RuntimeError("bwrap lost the race with the host's mounts every time") from None
    raise AssertionError("unreachable")


class _MountRace(Exception):
    pass


def _time_once(bundle: AgentBundle, spec: SandboxSpec) -> float:
    remap = remaps_ids()
    with tempfile.TemporaryDirectory(prefix="orchard-bench-bwrap-") as tmp:
        paths = SandboxPaths(sandbox_dir=Path(tmp) / "sandbox", run_dir=Path(tmp) / "run")
        paths.writable_dir.mkdir(parents=True)
        plain, sticky = writable_subdirs(None)  # as the backend makes them (local/backend.py)
        for sub in plain + sticky:
            (paths.writable_dir / sub).mkdir()
            if sub in sticky:
                os.chmod(paths.writable_dir / sub, 0o1777)
            if remap:
                os.chown(paths.writable_dir / sub, REMAP_BASE, REMAP_BASE)
        token_fd = _memfd("token", b"bench")
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe() if remap else (None, None)
        args = bwrap_args(spec, None, paths, bundle.path, "bench", agent_env(),
                          info_w, token_fd, userns_block_fd=block_r, hidden=LocalBackend()._hidden_paths())
        args_fd = _memfd("args", b"".join(a.encode() + b"\0" for a in args))
        passed = [fd for fd in (args_fd, info_w, token_fd, block_r) if fd is not None]
        started = time.perf_counter()
        try:
            proc = subprocess.Popen([find_bwrap(), "--args", str(args_fd), "--", "true"], env=HOST_ENV,
                                    pass_fds=passed, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            for fd in passed:
                os.close(fd)
        try:
            if block_w is not None:
                child = _read_child_pid(info_r)
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{child}/{name}", "w") as f:
                        f.write(id_map())
                os.write(block_w, b"1")
            if proc.wait(timeout=30) != 0:
                error = proc.stderr.read().decode(errors="replace")
                if any(message in error for message in MOUNT_RACE_MESSAGES):
                    raise _MountRace()
                raise RuntimeError(f"bwrap running `true` exited with {proc.returncode}: {error}")
            return time.perf_counter() - started
        finally:
            os.close(info_r)
            if block_w is not None:
                os.close(block_w)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
