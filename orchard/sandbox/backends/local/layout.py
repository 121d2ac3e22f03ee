"""Where a local backend's sandboxes live on the host and the names they go by there: the key of each
sandbox (its run dir, cgroups and allowlist interface are named by it), the run base that holds their
sockets, and Orchard's own directories, which sandboxes must not reach."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

from orchard.core.errors import BackendError


def owner_of(root_dir: Path, run_base: Path) -> str:
    """8 hex of (root_dir, run_dir), the start of every key (`<owner>-`): the sweep for abandoned cgroups
    takes only groups named so, never those of another backend on this machine (another home, another
    orchestrator), whose creates in progress it cannot see."""
    where = f"{root_dir.resolve()}\0{run_base.resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:8]


def sandbox_key(owner: str, root_dir: Path, sandbox_id: str) -> str:
    """Short, unique per (root_dir, run_dir, id)."""
    sandbox = hashlib.sha256(f"{root_dir.resolve()}\0{sandbox_id}".encode()).hexdigest()[:16]
    return f"{owner}-{sandbox}"


def legacy_key(root_dir: Path, sandbox_id: str) -> str:
    """The key before it named its owner: a sandbox made by an earlier version and interrupted before
    it recorded its cgroups has them under this name."""
    return hashlib.sha256(f"{root_dir.resolve()}\0{sandbox_id}".encode()).hexdigest()[:20]


def ensure_run_base(run_base: Path) -> None:
    """The run base is shared by everyone's sandboxes of this uid in a world-writable /tmp: refuse it
    unless it is our own private directory."""
    run_base.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(run_base)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(run_base, 0o700)  # ours, merely too open (umask): tighten it
        st = os.lstat(run_base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BackendError(f"{run_base} must be a directory owned by uid {os.getuid()} with mode "
                           "0700; remove it or pass another run_dir to LocalBackend")


def make_private(root_dir: Path, homes: set[Path]) -> None:
    """Orchard's state (every sandbox's files; in the home, the state db with live tokens) is 0700:
    sandboxes of root run as an unprivileged host uid, so the mode is what keeps them out of the
    homes of *other* orchestrators too, which no tmpfs cover of this one hides."""
    root_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root_dir.name == "sandboxes":  # the layout of an Orchard home: <home>/sandboxes
        homes = homes | {root_dir.parent}
    for path in (root_dir, *homes):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.chmod(path, st.st_mode & 0o7700)
