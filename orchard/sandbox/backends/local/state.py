"""What the local backend remembers of a sandbox, on disk and in `BackendSandbox.handle`, and how it
recognises the sandbox's processes again (a pid plus its start time, so a reused pid is never mistaken
for the sandbox)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from orchard.core.atomic_write import atomic_write_text


class LocalHandle(BaseModel):
    """Backend-private state of one sandbox; persisted by the orchestrator and in `meta.json`."""

    pid: int                     # bwrap's monitor process (the one the backend started)
    pid_start: int               # its start time in clock ticks since boot (/proc/PID/stat field 22)
    init_pid: int | None = None  # the sandbox's pid-namespace init, as a host pid
    init_start: int | None = None
    sandbox_dir: str
    run_dir: str
    socket: str
    cgroups: list[str] = []
    net_slot: int | None = None  # network allowlist: its veth pair and rules (netns.py)
    agent_pid: int | None = None  # the agent, where the zygote forked it (not a child of the init then)


class SandboxRecord(BaseModel):
    """`meta.json` in the sandbox's directory: enough for a new backend instance to find it again."""

    id: str
    agent_url: str
    handle: LocalHandle


def write_record(path: Path, record: SandboxRecord) -> None:
    """Atomically: a reader sees the old record or the new one, never half of one. Not fsync'd: the record
    must survive the orchestrator's crash (the rename does that), not the machine's, which ends the
    sandbox it describes; three fsyncs per create cost ~2 ms."""
    atomic_write_text(path, record.model_dump_json(), durable=False)


def read_record(path: Path) -> SandboxRecord | None:
    try:
        return SandboxRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return data[data.rindex(")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_running(pid: int | None, start: int | None) -> bool:
    """True when `pid` is still the process that started at `start` and has not exited (zombies count
    as exited: their parent may never reap them)."""
    if not pid or start is None:
        return False
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X") and int(fields[19]) == start


def children_of(pid: int) -> list[int]:
    """Host pids whose parent is `pid` (a scan of /proc; used only when bwrap's report of the sandbox
    init was never read)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and int(fields[1]) == pid:
                found.append(int(entry))
    return found
