"""The local backend's test rig: a LocalBackend on a temporary root (whatever it still runs is deleted and it
is closed afterwards), a sandbox with its agent client for the length of a block, and a minimal image made
of a static busybox (no Python, no libc), as a rootfs directory or as an image layer. The fixtures built on
it (`backend`, `busybox_rootfs`) are in conftest.py."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.core.backend import BackendSandbox
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.local import cgroups
from orchard.testing.oci_layout import Entry


def cgroup_v1_only() -> bool:
    """Whether every group a sandbox gets here is on cgroup v1 (cgroup2 cannot rename one: no spares)."""
    try:
        placed = cgroups.placements("probe")
    except OSError:
        return False
    return bool(placed) and all(version == 1 for _, version, _ in placed)


async def shut_down(backend: LocalBackend) -> None:
    """Delete what `backend` still runs (a failed test's sandboxes), then close it."""
    for found in await backend.list_live():
        await backend.delete(found)
    await backend.close()


@contextlib.asynccontextmanager
async def local_backend(root: Path, **options: Any) -> AsyncIterator[LocalBackend]:
    """A LocalBackend keeping its sandboxes under `root` (`options`: the constructor's), shut down afterwards."""
    backend = LocalBackend(root, **options)
    try:
        yield backend
    finally:
        await shut_down(backend)


@contextlib.asynccontextmanager
async def running(backend: LocalBackend, spec: SandboxSpec | None = None, sandbox_id: str | None = None,
                  token: str | None = None) -> AsyncIterator[tuple[BackendSandbox, AgentSandbox]]:
    """A sandbox and a client of its agent, deleted after the block."""
    spec = spec or SandboxSpec()
    sandbox_id = sandbox_id or f"t{secrets.token_hex(5)}"
    token = token or secrets.token_hex(16)
    sb = await backend.create(sandbox_id, spec, token)
    agent = AgentSandbox(sandbox_id, sb.agent_url, token, workdir=spec.workdir)
    try:
        yield sb, agent
    finally:
        await agent.close()
        await backend.delete(sb)


def busybox() -> str:
    found = shutil.which("busybox")
    if found is None:
        pytest.fail("busybox is needed for the tests of images without Python: run scripts/setup-system.sh")
    return found


def busybox_applets() -> list[str]:
    """Every applet of the host's busybox."""
    listed = subprocess.run([busybox(), "--list"], capture_output=True, text=True, check=True).stdout.split()
    return [applet for applet in listed if applet != "busybox"]


def make_busybox_rootfs(root: Path) -> Path:
    """`root` made a rootfs with nothing but a static busybox and its applets in /bin."""
    (root / "bin").mkdir()
    shutil.copy2(busybox(), root / "bin" / "busybox")
    for applet in busybox_applets():
        (root / "bin" / applet).symlink_to("busybox")
    return root


def busybox_layer(applets: Iterable[str]) -> list[Entry]:
    """An image layer with a static busybox as /bin/busybox and `applets` linked to it."""
    entries = [Entry.dir("bin"), Entry.file("bin/busybox", Path(busybox()).read_bytes(), mode=0o755)]
    return entries + [Entry.symlink(f"bin/{applet}", "busybox") for applet in applets]
