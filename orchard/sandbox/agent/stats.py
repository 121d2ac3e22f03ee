"""`GET /stats`: what the sandbox has used so far, as the agent sees it.

`cpu_seconds`: CPU time (user + system) of every process in the agent's pid namespace — the whole
sandbox: the agent, its commands and their workload's own namespace, if any — counted from each live
process's own time plus that of the children it has reaped (`/proc/PID/stat` fields 14-17), so a process
that ever ran there counts once. Read from the agent's /proc, which also sees the commands' processes
when they run in a namespace of their own, where the agent (which reaps them) is invisible. The kernel
counts in clock ticks (10 ms) and the reading is a snapshot, not atomic: a process reaped while the files
are read can be missed or counted twice, so the difference of two readings is approximate. None when
/proc cannot be read."""

from __future__ import annotations

import os

from . import own_proc


def handle_stats(req) -> dict:
    ticks, processes = 0, 0
    try:
        entries = own_proc.listdir_proc()
    except OSError:
        return {"cpu_seconds": None, "processes": None}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with own_proc.open_proc(entry + "/stat", "rb") as f:
                line = f.read()
        except OSError:
            continue  # ended while we read
        fields = line[line.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
        if len(fields) >= 15:
            ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
            processes += 1
    return {"cpu_seconds": ticks / os.sysconf("SC_CLK_TCK") if processes else None, "processes": processes}
