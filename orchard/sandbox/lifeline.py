"""Embedded sandboxes end with the process that owns them, however it ends: a SIGKILL (`kill -9` of
`orchard eval`, the OOM killer) runs no `finally` and no exit hook (exit_cleanup.py), yet must not leave its
sandboxes running until another Orchard process happens to start on the same home.

Each embedded orchestrator starts one watcher: `python -m orchard.sandbox.lifeline OWNER_PID`, in a session
of its own (a kill of the owner's process group does not reach it). Its stdin is the read end of a pipe whose
only write end is the owner's (close-on-exec: no child of the owner holds it, so it ends exactly when the owner
does). The owner first writes one line (its home and backend config), and when it closes its client — its
sandboxes deleted — a goodbye: the watcher then exits with nothing to do. When the pipe ends without a
goodbye, the owner is gone: the watcher waits until its process has ended, then does what the next
orchestrator on that home would: starts one, which takes over the dead instance's sandboxes and deletes them
(they were ephemeral), and stops it. Every backend's own delete runs, so nothing of theirs is left (processes,
cgroups, mounts, network namespaces, directories). Sandboxes of a server (`orchard serve`) are not embedded:
they end by their TTL."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the watcher imports nothing heavy until its owner is gone: it starts with every client
    from orchard.core.backend import BackendConfig

log = logging.getLogger(__name__)

GOODBYE = b"closed\n"
OWNER_EXIT_WAIT_S = 60.0  # how long the watcher waits for a process whose pipe ended to be gone
LOG_FILE = "lifeline.log"  # in the home, written only when the watcher's clean-up fails


class Lifeline:
    """The owner's end: started with the orchestrator, `release()`d when the client closes."""

    def __init__(self, home: Path, config: BackendConfig) -> None:
        read_end, self._write_end = os.pipe()  # both close-on-exec: the watcher gets its end as stdin only
        try:
            self._watcher = subprocess.Popen(
                [sys.executable, "-m", "orchard.sandbox.lifeline", str(os.getpid())], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)
        setup = {"home": str(home), "backend": config.model_dump(mode="json")}
        os.write(self._write_end, json.dumps(setup).encode() + b"\n")

    def release(self) -> None:
        """The owner deleted its sandboxes itself: the watcher ends with nothing to do."""
        if self._write_end < 0:
            return
        try:
            os.write(self._write_end, GOODBYE)
        except OSError:
            pass  # the watcher is gone already
        finally:
            os.close(self._write_end)
            self._write_end = -1
        try:
            self._watcher.wait(timeout=10)  # reaped: no zombie left behind
        except subprocess.TimeoutExpired:
            log.warning("the sandbox lifeline watcher (pid %d) did not end after its goodbye", self._watcher.pid)


def _gone(pid: int) -> bool:
    """The process has ended: it no longer exists, or is a zombie (it runs nothing; its parent has yet to
    reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


async def _clean_up(home: Path, backend: dict) -> None:
    from orchard.sandbox.backends.registry import parse_backend_config
    from orchard.sandbox.server.service import SandboxService

    service = SandboxService.embedded(home, backend=parse_backend_config(backend, home))
    await service.start()  # takes over the dead owner's sandboxes, deleting them
    await service.stop(delete_all=True)


def main(argv: list[str]) -> int:
    owner = int(argv[0])
    first = sys.stdin.buffer.readline()
    if not first:
        return 0  # the owner ended before it made anything
    setup = json.loads(first)
    if sys.stdin.buffer.read() == GOODBYE:  # blocks until the owner's end closes
        return 0
    deadline = time.monotonic() + OWNER_EXIT_WAIT_S
    while not _gone(owner) and time.monotonic() < deadline:
        time.sleep(0.05)
    home = Path(setup["home"])
    import asyncio

    try:
        asyncio.run(_clean_up(home, setup["backend"]))
    except Exception:
        logging.basicConfig(filename=home / LOG_FILE, format="%(asctime)s %(levelname)s %(message)s")
        log.exception("deleting the sandboxes of process %d, which ended without deleting them, failed; the "
                      "next Orchard process on this home deletes them", owner)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
