"""Helpers of the chaos tests (tests/test_chaos.py): an orchestrator that can be killed and restarted on
the same port, a sampler of how many sandboxes exist on the host, and the orphan checks — everything a
run could have left behind, found from the host (processes, mounts, cgroups, directories, store rows) or,
for the Kubernetes backend, from the API server (Pods, Secrets, NetworkPolicies by label).

Every sandbox of a run carries one environment variable, `ORCHARD_CHAOS_MARK=<run id>`, so that its agent
and commands are found by their environment; bwrap's own processes are found by the cgroups of the run's
sandbox keys."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import httpx
from pydantic import BaseModel

from orchard.sandbox.server.home import state_db_path
from tests.running_server import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
MARK = "ORCHARD_CHAOS_MARK"
# `serve()` with its options as JSON; `caps` and `pools` become their models.
SERVE = """
import json, sys
from orchard.sandbox.server.main import serve
options = json.loads(sys.argv[1])
if "caps" in options:
    from orchard.sandbox.server.admission import CreateCaps
    options["caps"] = CreateCaps.model_validate(options["caps"])
if "pools" in options:
    from orchard.core.pool import PoolsConfig
    options["pools"] = PoolsConfig.model_validate(options["pools"])
serve(**options)
"""
START_TIMEOUT_S = 60.0


# --- the orchestrator ----------------------------------------------------------------------------------


class ChaosServer:
    """`serve()` in a subprocess on a fixed port, so that clients keep one URL across kills and restarts.
    `options`: more keyword arguments of `serve()` (e.g. caps); `env`: more environment variables."""

    def __init__(self, home: Path, api_key: str, *, backend: str = "local", reap_interval_s: float = 0.5,
                 options: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.home, self.api_key = home, api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.options = {"host": "127.0.0.1", "port": self.port, "backend": backend, "api_key": api_key,
                        "home": str(home), "reap_interval_s": reap_interval_s, "log_level": "info",
                        **(options or {})}
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.kills = 0
        self.start_s: list[float] = []  # how long each start took until /healthz answered

    @property
    def log(self) -> Path:
        return self.home / "serve.log"

    def start(self, *, wait: bool = True) -> None:
        """Start it; with `wait`, until /healthz answers (after its reconciliation)."""
        assert self.process is None, "already running"
        with open(self.log, "ab") as log:
            log.write(f"\n=== start {self.starts + 1} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-c", SERVE, json.dumps(self.options)],
                                            cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        if not wait:
            return
        began = time.monotonic()
        deadline = began + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the orchestrator exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    self.start_s.append(time.monotonic() - began)
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"the orchestrator did not come up in {START_TIMEOUT_S:g} s:\n{self.tail()}")

    def kill(self) -> None:
        """A crash: SIGKILL, nothing of the service's shutdown runs; its sandboxes keep running."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
            self.kills += 1

    def stop(self) -> None:
        """Graceful (SIGTERM); sandboxes keep running for the next start."""
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def tail(self, limit: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


# --- sampling ------------------------------------------------------------------------------------------


class Sampler:
    """Calls `count()` every `interval_s` on a thread of its own (so a busy event loop does not skip
    samples) and keeps every value; `peak` is the largest seen."""

    def __init__(self, count: Callable[[], int], interval_s: float = 0.05) -> None:
        self.count, self.interval_s = count, interval_s
        self.samples: list[tuple[float, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append((time.monotonic(), self.count()))
            except Exception as exc:  # noqa: BLE001 — reported by the test, never a dead sampler
                self.errors.append(f"{type(exc).__name__}: {exc}")

    @property
    def peak(self) -> int:
        return max((n for _, n in self.samples), default=0)


def local_sandbox_count(home: Path) -> int:
    """Sandboxes that exist on the host under `home`'s local backend: their directories, which are made
    before anything of a sandbox runs and removed after all of it is gone — so this never undercounts."""
    try:
        return sum(1 for entry in os.scandir(home / "sandboxes") if entry.is_dir())
    except FileNotFoundError:
        return 0


# --- the store -----------------------------------------------------------------------------------------


def store_states(home: Path) -> dict[str, str]:
    """id -> state of every sandbox row in `home`'s store, quarantined rows as `quarantined`."""
    path = state_db_path(home)
    if not path.exists():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        states = dict(db.execute("SELECT id, state FROM sandboxes").fetchall())
        if "quarantine" in tables:
            for (sandbox_id,) in db.execute("SELECT id FROM quarantine WHERE kind = 'sandbox' AND NOT cleaned_up"):
                states[sandbox_id] = "quarantined"
    return states


def pool_claims(home: Path) -> int:
    """Sandboxes of `home`'s store that were handed out from a warm pool (any state)."""
    path = state_db_path(home)
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        return sum(1 for (record,) in db.execute("SELECT record FROM sandboxes")
                   if ((json.loads(record).get("info") or {}).get("pool") or {}).get("claimed"))


# --- what a run left behind ----------------------------------------------------------------------------


# A record is finished once deleted, or lost with its leftovers removed (an idle pool member that died is
# lost and stays so: it is listed to no one, so no one deletes it, and it is forgotten after the retention).
FINISHED_STATES = ("deleted", "lost")


class Footprint(BaseModel):
    """What still exists of a run's sandboxes; every list empty = nothing left."""

    processes: list[str] = []
    mounts: list[str] = []
    cgroups: list[str] = []
    dirs: list[str] = []
    network: list[str] = []  # allowlist interfaces and nftables chains (local backend)
    records: list[str] = []  # store rows not finished (see FINISHED_STATES), quarantined ones pending
    pods: list[str] = []
    secrets: list[str] = []
    network_policies: list[str] = []

    @property
    def empty(self) -> bool:
        return not any(getattr(self, field) for field in type(self).model_fields)

    def describe(self) -> str:
        return "; ".join(f"{field}: {', '.join(values[:10])}{' ...' if len(values) > 10 else ''}"
                         for field, values in self.model_dump().items() if values) or "nothing"


def new_mark() -> str:
    return uuid.uuid4().hex


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _describe_pid(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmdline = "?"
    return f"{pid} ({cmdline.strip()[:80]})"


def _sandbox_key_of(cgroup_line: str) -> str | None:
    """The sandbox key of a `/proc/PID/cgroup` line: the group right under an `orchard` group (a sandbox's
    group may have groups of its own beneath it)."""
    parts = cgroup_line.split(":", 2)[-1].split("/")
    for parent, child in zip(parts, parts[1:]):
        if parent == "orchard":
            return child
    return None


def local_footprint(home: Path, mark: str, ids: set[str]) -> Footprint:
    """What of the sandboxes `ids` (and any sandbox carrying `mark`) is left under `home`'s local backend:
    processes (by the mark in their environment, or by living in one of the sandboxes' cgroups or a
    spare's), mounts of the home or the sandboxes' run dirs, cgroups named by the sandboxes' keys and the
    backend's spares (local/spares.py: made ahead of creates, they must not outlive their orchestrator),
    their directories, and store rows not `deleted`."""
    from orchard.sandbox.backends.local import cgroups
    from orchard.sandbox.backends.local.spares import SPARE_INFIX
    from orchard.sandbox.backends.registry import backend_config, create_backend

    backend = create_backend(backend_config("local", home))
    keys = {backend._key(sandbox_id) for sandbox_id in ids}
    spare_groups = _groups_named(f"{backend.owner}-{SPARE_INFIX}")
    keys |= {Path(group).name for group in spare_groups}
    run_dirs = {str(backend.run_base / key) for key in keys}
    needle = f"{MARK}={mark}".encode()
    found = Footprint()
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            groups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        in_group = any(_sandbox_key_of(line) in keys for line in groups.splitlines())
        if needle in environ or in_group:
            found.processes.append(_describe_pid(pid))
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if point.startswith(str(home)) or any(point.startswith(d) for d in run_dirs):
                found.mounts.append(point)
    for key in sorted(keys):
        found.cgroups += cgroups.existing_groups(key)
    sandboxes = home / "sandboxes"
    if sandboxes.is_dir():
        found.dirs += [str(p) for p in sandboxes.iterdir()]
    found.dirs += sorted(d for d in run_dirs if os.path.lexists(d))
    found.network = local_network_leftovers(keys)
    found.records = sorted(f"{sandbox_id}={state}" for sandbox_id, state in store_states(home).items()
                           if state not in FINISHED_STATES)
    return found


def _groups_named(prefix: str) -> list[str]:
    """Sandbox groups (beneath an `orchard` group of this process's cgroups) whose name starts with `prefix`."""
    from orchard.sandbox.backends.local import cgroups

    found = []
    for group, _, _ in cgroups.placements("probe"):
        with contextlib.suppress(OSError):
            found += [str(g) for g in group.parent.iterdir() if g.is_dir() and g.name.startswith(prefix)]
    return found


def local_network_leftovers(keys: set[str]) -> list[str]:
    """Network allowlist state of the sandboxes `keys` still on the host: their veth interfaces (alias: the
    key) and their nftables chains (comment: the key). See orchard/sandbox/backends/local/netns.py."""
    from orchard.sandbox.backends.local import netns as local_netns

    found = []
    sys_net = Path("/sys/class/net")
    for name in sorted(os.listdir(sys_net)) if sys_net.is_dir() else []:
        try:
            alias = (sys_net / name / "ifalias").read_text().strip()
        except OSError:
            continue
        if alias in keys:
            found.append(f"interface {name} ({alias})")
    if local_netns.unavailable_reason() is None:
        listed = subprocess.run(["nft", "list", "table", "inet", local_netns.TABLE], capture_output=True,
                                text=True)
        for chain, key in re.findall(r'chain (\S+) \{\s*comment "([^"]+)"', listed.stdout):
            if key in keys:
                found.append(f"nftables chain {chain} ({key})")
    return found


def k8s_footprint(kubeconfig: str, namespace: str, instance: str) -> Footprint:
    """Pods (those being deleted too), Secrets and NetworkPolicies of one backend instance (its label
    selector) in `namespace`."""
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    from orchard.sandbox.backends.kubernetes.pods import instance_selector

    selector = instance_selector(instance)
    api = load_api_client(kubeconfig)
    try:
        core, net = client.CoreV1Api(api), client.NetworkingV1Api(api)
        return Footprint(
            pods=k8s_pod_names(kubeconfig, namespace, instance),
            secrets=[s.metadata.name for s in
                     core.list_namespaced_secret(namespace, label_selector=selector).items],
            network_policies=[p.metadata.name for p in
                              net.list_namespaced_network_policy(namespace, label_selector=selector).items])
    finally:
        api.close()


def wait_until_empty(footprint: Callable[[], Footprint], timeout_s: float) -> Footprint:
    """The footprint once empty, or the last one seen after `timeout_s` (processes take a moment to be
    reaped by the kernel after a SIGKILL)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = footprint()
        if found.empty or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


# --- chaos on the local backend ------------------------------------------------------------------------


def _kill(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def kill_in_local_sandbox(home: Path, rng, what: str) -> str | None:
    """SIGKILL one part of a random running sandbox under `home`: its `agent`, its `init` (the pid
    namespace's init: everything in it dies) or bwrap's `monitor` (the sandbox itself lives on). Returns
    the sandbox's id, or None when no sandbox had that part running."""
    from orchard.sandbox.backends.local.state import children_of, process_running, read_record

    try:
        entries = [e.path for e in os.scandir(home / "sandboxes") if e.is_dir()]
    except FileNotFoundError:
        return None
    rng.shuffle(entries)
    for entry in entries:
        record = read_record(Path(entry) / "meta.json")
        if record is None:
            continue
        handle = record.handle
        if not process_running(handle.init_pid, handle.init_start):
            continue
        if what == "init":
            pids = [handle.init_pid]
        elif what == "monitor":
            pids = [handle.pid] if process_running(handle.pid, handle.pid_start) else []
        else:  # the agent: the init's child
            pids = children_of(handle.init_pid)
        if pids and _kill(pids[0]):
            return record.id
    return None


# --- chaos on the Kubernetes backend -------------------------------------------------------------------


def k8s_pod_names(kubeconfig: str, namespace: str, instance: str, *, running_only: bool = False) -> list[str]:
    """Every Pod of one backend instance, those being deleted included (`running_only`: those running and
    not being deleted)."""
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    from orchard.sandbox.backends.kubernetes.pods import instance_selector

    api = load_api_client(kubeconfig)
    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=instance_selector(instance))
        return [p.metadata.name for p in pods.items
                if not running_only or (p.status.phase == "Running" and p.metadata.deletion_timestamp is None)]
    finally:
        api.close()


def delete_random_pod(kubeconfig: str, namespace: str, instance: str, rng) -> str | None:
    """Delete one random Pod of the instance at once (grace 0), as a node failure or eviction would: a
    running one when there is one, half of the time (else Pods would mostly die while starting, which is
    where they spend most of their short lives)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from orchard.sandbox.backends.kubernetes.client import load_api_client

    names = k8s_pod_names(kubeconfig, namespace, instance, running_only=rng.random() < 0.5)
    names = names or k8s_pod_names(kubeconfig, namespace, instance)
    if not names:
        return None
    name = rng.choice(names)
    api = load_api_client(kubeconfig)
    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        return name
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    finally:
        api.close()
