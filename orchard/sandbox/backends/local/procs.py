"""The local backend's small process and file helpers: killing and waiting for processes, removing a
sandbox's directories, the descriptors a create holds and those it hands to an agent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from orchard.sandbox.backends.local.state import process_running


def file_age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


class Fd:
    """One descriptor, held until it is handed on (`take`: the taker closes it) or closed; closing twice is
    harmless, so an ExitStack may hold it whatever became of it (`stack.enter_context(Fd(fd)).fd`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def take(self) -> int:
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> "Fd":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def never_readable_fd() -> int:
    """A pipe opened for reading and writing at once (through /proc): a read on it blocks for as long as
    the descriptor exists, since its holder is a writer too."""
    read_end, write_end = os.pipe()
    try:
        return os.open(f"/proc/self/fd/{read_end}", os.O_RDWR | os.O_CLOEXEC)
    finally:
        os.close(read_end)
        os.close(write_end)


def fds_named_in(agent_argv: list[str]) -> list[int]:
    """The descriptors the agent's arguments name (`--listen fd:N`, `--...-fds N,M`), in order."""
    fds = []
    for option, value in zip(agent_argv, agent_argv[1:]):
        if option == "--listen" and value.startswith("fd:"):
            fds.append(int(value[3:]))
        elif option.endswith("-fds"):
            fds += [int(n) for n in value.split(",") if n]
    return fds


def kill(pid: int | None) -> None:
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_gone(pid: int, start: int, proc: subprocess.Popen | None, timeout: float) -> None:
    """Wait for bwrap's monitor to exit after its sandbox died; SIGKILL it past `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not process_running(pid, start):
            return
        time.sleep(0.002)
    kill(pid)
    if proc is not None:
        proc.wait()


def rmtree(path: Path) -> None:
    """rm -rf that also gets through the overlay's `work/work` (mode 000)."""
    def make_writable_and_retry(func, p, exc_info):
        if isinstance(exc_info[1], FileNotFoundError):
            return  # already gone (removed concurrently): nothing to do
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, ignore_errors=True)
            elif func in (os.unlink, os.remove, os.rmdir):
                func(p)
        except OSError:
            pass

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=make_writable_and_retry)


def tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace").strip()
