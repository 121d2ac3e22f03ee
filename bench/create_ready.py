"""Measurement 2: create → ready, one sandbox at a time, against bubblewrap alone (the same sandbox's bwrap
running `true`: the floor of isolation) and the floor of starting a Python HTTP server process (no
isolation) and getting its first answer."""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import httpx
from rich.progress import Progress

from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import embedded_orchard
from bench.peers.bare_agent import agent_bundle, time_bare_agent_start
from bench.peers.bwrap_alone import time_bwrap_true
from bench.peers.cgroup_move import time_cgroup_move
from bench.peers.floor import floor_server
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats
from orchard.core.sandbox import STARTUP_STAGES, StartupTimings
from orchard.sandbox.backends.local import netns as local_netns

CREATE_P50_MS = 60.0
VS_BWRAP_MAX = 3.0  # issue 13: cold create→ready within 3× bubblewrap alone
ORCHARD_CREATE, ORCHARD_DELETE = "Orchard create→ready, agent started by bwrap", "Orchard delete"
ALLOWLIST_CREATE = "Orchard create→ready, network allowlist"
# A documentation address: nothing is reached, only the veth pair and the rules are made.
ALLOWLIST = {"mode": "allowlist", "allow": ["198.51.100.7:80"]}
FLOOR_START, BARE_AGENT = "floor process start", "agent alone (no sandbox)"
BWRAP_ALONE = "bubblewrap alone (`true`)"
ZYGOTE_CREATE = "Orchard create→ready, agent from the zygote"
NO_SPARES_CREATE = "Orchard create→ready, agent from the zygote, no spares"


def _time_floor_start() -> float:
    started = time.perf_counter()
    with floor_server() as server:
        # verify=False: an http:// URL needs no TLS, and building the CA context alone costs ~15 ms.
        with httpx.Client(verify=False, timeout=30) as client:
            client.get(server.url + "/health").raise_for_status()
        return time.perf_counter() - started


def _time_create(orchard, **spec) -> tuple[float, float, StartupTimings | None]:
    """(create→ready, delete) in seconds and where the start went (as the orchestrator reported it); the
    sandbox runs `true` once in between."""
    started = time.perf_counter()
    sandbox = orchard.create(**spec)
    ready = time.perf_counter()
    try:
        if sandbox.exec("true").exit_code != 0:
            raise RuntimeError("a freshly created sandbox could not run `true`")
    finally:
        closing = time.perf_counter()
        sandbox.close()
    return ready - started, time.perf_counter() - closing, sandbox.startup


def _stages_note(creates: list[tuple[float, StartupTimings]]) -> str:
    """The zygote create's p50 stage by stage, and what is added around them; `creates`: (create→ready
    in ms as the caller saw it, its startup timings)."""
    timings = [t for _, t in creates]

    def p50(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    stages = {name: p50([getattr(t, name) or 0.0 for t in timings]) for name in STARTUP_STAGES}
    parts = ", ".join(f"{name.removesuffix('_ms').replace('_', ' ')} {ms:.1f} ms" for name, ms in stages.items() if ms)
    outside = p50([wall - t.total_ms for wall, t in creates])
    return (f"Where a create with the zygote goes (p50 of each stage, from `sandbox.startup`): {parts}; the "
            f"orchestrator's whole create {p50([t.total_ms for t in timings]):.1f} ms, and {outside:.2f} ms more "
            "between the caller's clock and the orchestrator's: the record written once ready, then the sync "
            "SDK (its hop to its event-loop thread, the sandbox's client).")


def run(ctx: BenchContext) -> Findings:
    count, warmup = ctx.pick(30, 5), ctx.pick(3, 1)
    # Root with ip/nft/nsenter only (local/netns.py); interleaved with the plain creates, so that both
    # see the same machine.
    with_allowlist = local_netns.unavailable_reason() is None
    creates: list[float] = []
    allowlist_creates: list[float] = []
    deletes: list[float] = []
    floor_starts: list[float] = []
    bare_agent_starts: list[float] = []
    bwrap_runs: list[float] = []
    zygote_creates: list[float] = []
    no_spare_creates: list[float] = []
    zygote_stages: list[tuple[float, StartupTimings]] = []
    # The agent zygote (docs/local-backend.md#start-path) is root's default; its creates alternate with
    # those of agents bwrap starts (`zygote: false`, the way without it).
    with_zygote = os.geteuid() == 0
    with (agent_bundle() as bundle, embedded_orchard(zygote=False) as orchard,
          embedded_orchard(zygote=True) if with_zygote else contextlib.nullcontext() as zygote_orchard,
          embedded_orchard(zygote=True, spares=0) if with_zygote else contextlib.nullcontext() as no_spares,
          Progress(console=ctx.console, transient=True) as progress):
        task = progress.add_task(f"create→ready × {count}", total=warmup + count)
        for index in range(warmup + count):
            created, deleted, _ = _time_create(orchard)
            allowlisted, *_ = _time_create(orchard, network=ALLOWLIST) if with_allowlist else (0.0, 0.0, None)
            floor_start, bare_agent_start = _time_floor_start(), time_bare_agent_start(bundle)
            bwrap_run = time_bwrap_true(bundle)
            zygote_created, _, zygote_startup = _time_create(zygote_orchard) if with_zygote else (0.0, 0.0, None)
            time.sleep(0.1)  # without a cgroup move (the spare made after the create above moves 2 processes)
            no_spare_created, *_ = _time_create(no_spares) if with_zygote else (0.0, 0.0, None)
            if index >= warmup:
                creates.append(created)
                deletes.append(deleted)
                allowlist_creates.append(allowlisted)
                floor_starts.append(floor_start)
                bare_agent_starts.append(bare_agent_start)
                bwrap_runs.append(bwrap_run)
                zygote_creates.append(zygote_created)
                no_spare_creates.append(no_spare_created)
                if zygote_startup is not None:
                    zygote_stages.append((zygote_created * 1000, zygote_startup))
            progress.update(task, advance=1)
    # What each create's first cgroup move waits on this host (with no other move for 0.1 s before it).
    moves = [m for m in (time_cgroup_move() for _ in range(ctx.pick(5, 3))) if m is not None]
    stats = {ORCHARD_CREATE: LatencyStats.from_seconds(creates),
             ORCHARD_DELETE: LatencyStats.from_seconds(deletes),
             FLOOR_START: LatencyStats.from_seconds(floor_starts),
             BARE_AGENT: LatencyStats.from_seconds(bare_agent_starts),
             BWRAP_ALONE: LatencyStats.from_seconds(bwrap_runs)}
    create, floor, bare = stats[ORCHARD_CREATE], stats[FLOOR_START], stats[BARE_AGENT]
    bwrap = stats[BWRAP_ALONE]
    rows = []
    if with_zygote:
        stats[ZYGOTE_CREATE] = zygote = LatencyStats.from_seconds(zygote_creates)
        stats[NO_SPARES_CREATE] = no_spare = LatencyStats.from_seconds(no_spare_creates)
        rows.append(Row(metric="create→ready p50 vs bubblewrap alone, agent from the zygote", unit="ms",
                        ours=zygote.p50_ms, peers={BWRAP_ALONE: bwrap.p50_ms, ORCHARD_CREATE: create.p50_ms,
                                                   NO_SPARES_CREATE: no_spare.p50_ms},
                        ratios={"zygote/bwrap": ratio(zygote.p50_ms, bwrap.p50_ms),
                                "zygote/orchard": ratio(zygote.p50_ms, create.p50_ms),
                                "zygote/no_spares": ratio(zygote.p50_ms, no_spare.p50_ms)},
                        targets=[Target(on="zygote/bwrap", op="<=", limit=VS_BWRAP_MAX)]))
    rows += [
        Row(metric="create→ready p50 vs bubblewrap alone", unit="ms", ours=create.p50_ms,
            peers={BWRAP_ALONE: bwrap.p50_ms},
            ratios={"orchard/bwrap": ratio(create.p50_ms, bwrap.p50_ms)},
            targets=[] if with_zygote else [Target(on="orchard/bwrap", op="<=", limit=VS_BWRAP_MAX)]),
        Row(metric="create→ready p50", unit="ms", ours=create.p50_ms,
            peers={FLOOR_START: floor.p50_ms, BARE_AGENT: bare.p50_ms},
            ratios={"orchard/floor_start": ratio(create.p50_ms, floor.p50_ms),
                    "orchard/bare_agent": ratio(create.p50_ms, bare.p50_ms)},
            targets=[Target(op="<=", limit=CREATE_P50_MS)]),
        Row(metric="create→ready p99", unit="ms", ours=create.p99_ms,
            peers={FLOOR_START: floor.p99_ms, BARE_AGENT: bare.p99_ms},
            ratios={"orchard/floor_start": ratio(create.p99_ms, floor.p99_ms),
                    "orchard/bare_agent": ratio(create.p99_ms, bare.p99_ms)}),
        Row(metric="delete p50", unit="ms", ours=stats[ORCHARD_DELETE].p50_ms),
    ]
    if moves:
        rows.append(Row(metric="one cgroup move after 0.1 s without one (this host; a create without a spare makes one)",
                        unit="ms", ours=statistics.median(moves) * 1000))
    if with_allowlist:
        stats[ALLOWLIST_CREATE] = allowlist_stats = LatencyStats.from_seconds(allowlist_creates)
        rows.append(Row(metric="create→ready p50, network allowlist", unit="ms", ours=allowlist_stats.p50_ms,
                        peers={ORCHARD_CREATE: create.p50_ms},
                        ratios={"allowlist/none": ratio(allowlist_stats.p50_ms, create.p50_ms)}))
    notes = [
        "`create()` returns once the sandbox's agent answers; the timing covers the namespaces, the "
        "agent's interpreter start and its first `/health`.",
        "The floor starts the project's interpreter with no sandbox around it (`python -m "
        "bench.peers.floor_server`) and waits for its first HTTP answer.",
        "Bubblewrap alone is `bwrap` with the arguments a default sandbox gets (the same binds, namespaces, "
        "user id map and capabilities; as root the id maps written while it waits, as the backend does) "
        "running `true`, from spawn to exit: what isolation costs with no agent, no cgroups and no "
        "bookkeeping (bench/peers/bwrap_alone.py).",
        "With the zygote (root's default; LocalConfig zygote=False turns it off), each agent is forked from "
        "one interpreter that has the agent imported into its sandbox's namespaces once bwrap has made its "
        "mounts, instead of bwrap starting an interpreter (docs/local-backend.md#start-path); one such "
        "create follows each create whose agent bwrap starts.",
        "The agent alone is Orchard's agent, from the same bundle, started straight on the host (no "
        "namespaces, no orchestrator) until its first `/health` answer: the difference to create→ready is "
        "what the sandbox and the orchestrator's bookkeeping add.",
        "Since the workload got a pid namespace of its own (so that it cannot stop or kill its agent; "
        "docs/security.md), the agent also makes that namespace and its init while it starts: about 6 ms "
        "of each create on a 2-core Xeon, measured against the same code with the namespace switched off.",
        "With network `allowlist` (root only; the row is left out otherwise) the backend also makes a veth "
        "pair and nftables rules (docs/local-backend.md#network-allowlist), on a thread while the agent "
        "starts: one such create follows each plain one.",
        "A create without a spare moves its sandbox's first processes into the sandbox's cgroups (writes to "
        "`cgroup.procs`). The kernel makes the first such move wait for an RCU grace period unless another "
        "move happened within about the last one: about 8 ms on a 2-core Xeon with cgroup v1. The zygote's "
        "creates take a spare instead (root's default on cgroup v1, docs/local-backend.md#spares): the "
        "sandbox's groups made after the create before, with bwrap's shell and the zygote's child already in "
        "them, so that the create makes no move at all (the kernel's cgroup_attach_task trace counted 6 moves "
        "in each create without a spare, 0 with one). *no spares* is the same zygote with `spares: 0`; each "
        "of its creates follows 0.1 s without a move, as a create in a program that does anything between "
        "creates does (the others follow the peers, over 100 ms without one). Bubblewrap alone joins no "
        "cgroup. The row *one cgroup move* times that wait on the host the run was on "
        "(bench/peers/cgroup_move.py): several ms on a stock kernel, well under 1 ms where the host has the "
        "cgroup option `favordynmods` on, which removes the wait from every move; on such a host the two "
        "zygote rows read alike, on a stock one *no spares* pays the wait.",
    ]
    if zygote_stages:
        notes.append(_stages_note(zygote_stages))
    return Findings(rows=rows, latencies=stats, notes=notes)


MEASUREMENT = Measurement(
    name="create_ready",
    title="Sandbox create → ready",
    method=("Sandboxes created one at a time with the sync SDK (`orchard.create()`), 30 after 3 warm-ups; "
            "each runs `true` once (to prove it is usable) and is deleted before the next; creation and "
            "deletion are timed separately. Between two creations, the floor server, the bare agent and "
            "bubblewrap alone are each started and stopped once; as root, one sandbox with network `allowlist`, "
            "one whose agent comes from the zygote (the default) and one from the zygote without spares are "
            "created too."),
    run=run,
)
