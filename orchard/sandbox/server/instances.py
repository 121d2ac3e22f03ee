"""Identity and liveness of orchestrator instances sharing one store.

An instance is alive until it stops, and only while its process runs: same host, same pid and the same
process start time (so a recycled pid does not keep a dead instance alive). Instances in this very process
are alive from start to stop. Instances on another host (a shared file system) count as alive while their
`last_seen` (refreshed by every reaper pass) is fresh."""

from __future__ import annotations

import os
import secrets
import socket
import time

from orchard.sandbox.server.models import ServiceRecord

# Service instances of this process that have started and not stopped yet.
_RUNNING_HERE: set[str] = set()


def new_service_record(*, ephemeral: bool) -> ServiceRecord:
    pid = os.getpid()
    return ServiceRecord(id=f"svc-{secrets.token_hex(6)}", host=socket.gethostname(), pid=pid,
                         pid_start=process_start_time(pid), last_seen=time.time(), ephemeral=ephemeral)


def mark_running(service_id: str, running: bool) -> None:
    if running:
        _RUNNING_HERE.add(service_id)
    else:
        _RUNNING_HERE.discard(service_id)


def is_alive(service: ServiceRecord, *, remote_stale_after_s: float) -> bool:
    if service.stopped:
        return False
    if service.host != socket.gethostname():
        return time.time() - service.last_seen < remote_stale_after_s
    if service.pid == os.getpid():
        return service.id in _RUNNING_HERE
    try:
        os.kill(service.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _is_zombie(service.pid):
        return False  # it has ended (its sandboxes' lifeline fired); its parent has not reaped it yet
    return service.pid_start is None or process_start_time(service.pid) == service.pid_start


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[:1] == [b"Z"]
    except OSError:
        return False


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); None where /proc is absent."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = data.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None
