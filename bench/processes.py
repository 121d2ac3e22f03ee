"""Peer servers run as child processes. Each lives in its own process group, is killed with that group
when its `with` block ends (Ctrl-C included), and is also killed by the kernel if the bench itself dies
(PR_SET_PDEATHSIG), so a benchmark never leaves a server behind."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

import httpx

_PR_SET_PDEATHSIG = 1
# Resolved here, in the parent: between fork and exec the child must not dlopen (another thread of the
# parent may have held the loader's lock at fork time).
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the process that started it exits."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_module_argv(module: str, *args: str) -> list[str]:
    """Run `module` with the bench's own interpreter (the project venv)."""
    return [sys.executable, "-m", module, *args]


def stop_process_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the child's whole process group, then SIGKILL what is still there after `grace_s`."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while others in its group (e.g. a shell it spawned) still run.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(timeout=grace_s)


@contextmanager
def child_process(argv: list[str], *, env: dict[str, str] | None = None,
                  capture_stdout: bool = False) -> Iterator[subprocess.Popen]:
    """Start `argv` in its own process group; stop the group on exit. stderr goes to a pipe-free sink so
    a chatty peer (uvicorn logs every request) never blocks on a full pipe."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture_stdout else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    try:
        yield proc
    finally:
        stop_process_group(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def read_ready_line(proc: subprocess.Popen, timeout_s: float = 30.0) -> str:
    """The `READY ...` line a server prints on stdout once it listens (the floor server and Orchard's agent
    both do); bounded, with a clear error when the process died or said something else."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if not line.startswith("READY"):
        raise RuntimeError(f"{' '.join(map(str, proc.args[:4]))} did not start (said {line!r} within "
                           f"{timeout_s:.0f} s, exit status {proc.poll()}); run it by hand to see why")
    return line


def wait_until_http_ok(url: str, proc: subprocess.Popen, *, headers: dict[str, str] | None = None,
                       timeout_s: float = 30.0) -> None:
    """Poll `url` until it answers 2xx; fail early with a clear message if the server process exits."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with status {proc.returncode} before answering "
                               f"{url}; run it by hand to see its error")
        try:
            if httpx.get(url, headers=headers, timeout=1.0).is_success:
                return
        except httpx.TransportError as exc:
            last_error = str(exc)
        time.sleep(0.02)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s ({last_error})")


def read_status_kib(status_text: str, field: str) -> int:
    """A `VmRSS:`-style field (in KiB) out of the text of a /proc/PID/status file."""
    for line in status_text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"{field} not found in /proc status text")


def proc_status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return read_status_kib(f.read(), field)


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM of `pid` so that it records the peak of what follows. False if the kernel refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
