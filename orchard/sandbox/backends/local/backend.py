"""The local backend (the embedded default): one bubblewrap sandbox per Orchard sandbox, no daemon.

Per sandbox:
- `<root_dir>/<id>/`: `meta.json` (how to find it again), `agent.log` (the agent's stderr) and `rw/`,
  the writable layer (workspace for image `host`, overlay upper/work dirs for a rootfs image);
- `<tmp>/orchard-run-<uid>/<key>/`: a short host-only directory holding the agent's Unix socket
  (`agent_url` = `unix://<path>`), bound and listening before the sandbox starts and handed to the agent
  as a file descriptor; the token reaches the agent through a memory file (never a command line);
- cgroups `orchard/<key>` (memory, pids, cpu) beneath this process's own, or rlimits when those cannot
  be written.
Sandboxes outlive the process that made them (no --die-with-parent) so a restarted orchestrator can
re-adopt them through `list_live`. The three ways a sandbox starts are in start.py, how it goes in
teardown.py, where it lives and what it is called in layout.py; see docs/local-backend.md."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path

from orchard.core.backend import BackendSandbox
from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.home import resolve_home
from orchard.core.sandbox import SandboxSpec, StartupTimings
from orchard.sandbox.backends.agent_health import check_health
import orchard.sandbox.backends.local.cgroups as cgroups
import orchard.sandbox.backends.local.netns as netns
from orchard.sandbox.backends.local.bwrap import (SandboxPaths, agent_env, encode_workload_env, remaps_ids,
                                                  shares_host_network, validate_disk, validate_image,
                                                  validate_network, with_image_env, workload_env)
from orchard.sandbox.backends.local.cgroups import CgroupSet
from orchard.sandbox.backends.local.config import AGENT_APART_ENV, LocalConfig, local_capabilities
from orchard.sandbox.backends.local.gateway import gateway_socket_for, model_gateway_socket
from orchard.sandbox.backends.local.launch import protect_workload_init, read_info
from orchard.sandbox.backends.local.layout import (ensure_run_base, legacy_key, make_private, owner_of,
                                                   sandbox_key)
from orchard.sandbox.backends.local.limits import check_cpu_floor, require_enforceable
from orchard.sandbox.backends.local.procs import file_age, rmtree, tail
from orchard.sandbox.backends.local.spares import Spare, SpareReserve
from orchard.sandbox.backends.local.start import (Plan, agent_command, bind_agent_socket, make_writable_layer,
                                                  outermost, start_from_spare, start_plain, start_with_zygote)
from orchard.sandbox.backends.local.state import (LocalHandle, SandboxRecord, process_running, process_start_time,
                                                  read_record, write_record)
from orchard.sandbox.backends.local.teardown import destroy, handle_from_disk, handle_of
from orchard.sandbox.backends.local.zygote import Zygote, zygote_wanted
from orchard.sandbox.bubblewrap import find_bwrap
from orchard.sandbox.bundle import AgentBundle, default_cache_dir, ensure_agent_bundle
from orchard.sandbox.harness_bundles.store import require_built
from orchard.sandbox.images import ImageStore

log = logging.getLogger(__name__)

SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
# A directory without meta.json this old is a create that crashed before recording anything.
STALE_UNRECORDED_S = 60.0
HEALTH_TIMEOUT_S = 10.0
MOUNT_RACE_ATTEMPTS = 4
MOUNT_RACE_MESSAGES = ("bwrap: Can't bind mount", "bwrap: Can't remount", "bwrap: Can't find source path")


def orchard_home() -> Path:
    return resolve_home()


class LocalBackend:
    """Sandboxes on this host through bubblewrap. `root_dir` holds their private directories (default
    `$ORCHARD_HOME/sandboxes`); `run_dir` their sockets (default `<tmp>/orchard-run-<uid>`, kept short for
    the 108-byte socket path limit); `bundle_cache_dir` the agent bundle (default `$ORCHARD_HOME/cache`);
    `image_dir` the images `orchard image import` unpacked (default `$ORCHARD_HOME/images`).
    `agent_apart` (default: `ORCHARD_LOCAL_AGENT_APART=1` in the environment, else off; root only): the
    agent runs as a uid of its own that the workload cannot signal, at the price of a fork instead of a
    vfork per command (~0.5-1 ms more exec latency); see docs/local-backend.md#user-ids.
    `zygote` (root only; default on, off with `ORCHARD_LOCAL_ZYGOTE=0` in the environment): agents are
    forked from one pre-started interpreter into their sandboxes instead of each starting its own; see
    docs/local-backend.md#start-path. `spares` (with the zygote, on cgroup v1; default 1, 0 for none): that
    many sandboxes' cgroups are made ahead of their creates with the processes that start a sandbox
    already in them, so that a create makes no cgroup move; see docs/local-backend.md#spares."""

    name = "local"
    Config = LocalConfig

    def __init__(self, root_dir: Path | None = None, *, run_dir: Path | None = None,
                 bundle_cache_dir: Path | None = None, ready_timeout_s: float = 30.0,
                 agent_apart: bool | None = None, model_gateway: str | None = None,
                 image_dir: Path | None = None, zygote: bool | None = None, spares: int = 1,
                 home: Path | None = None) -> None:
        self.home = Path(home) if home is not None else orchard_home()  # the orchestrator's: hidden
        self.root_dir = Path(root_dir) if root_dir is not None else orchard_home() / "sandboxes"
        self.images = ImageStore(Path(image_dir) if image_dir is not None else orchard_home() / "images")
        self.run_base = (Path(run_dir) if run_dir is not None
                         else Path(tempfile.gettempdir()) / f"orchard-run-{os.getuid()}")
        self.bundle_cache_dir = (Path(bundle_cache_dir) if bundle_cache_dir is not None
                                 else default_cache_dir())
        self.ready_timeout_s = ready_timeout_s
        self.agent_apart = (os.environ.get(AGENT_APART_ENV) == "1") if agent_apart is None else agent_apart
        self._bwrap: str | None = None
        self._bundle: AgentBundle | None = None
        self._children: dict[str, subprocess.Popen] = {}
        self.zygote = zygote
        self._zygote: Zygote | None = None
        self.spares = spares
        self.gateway_socket = model_gateway_socket(model_gateway)  # network.gateway's (unix:/PATH)
        self.capabilities = local_capabilities(model_gateway=self.gateway_socket is not None)

    @classmethod
    def from_config(cls, config: LocalConfig) -> "LocalBackend":
        return cls(config.root_dir, run_dir=config.run_dir, bundle_cache_dir=config.bundle_cache_dir,
                   ready_timeout_s=config.ready_timeout_s, agent_apart=config.agent_apart,
                   model_gateway=config.model_gateway, image_dir=config.image_dir, zygote=config.zygote,
                   spares=config.spares, home=config.home)

    # ---- paths (layout.py) ---------------------------------------------------------------------------

    @functools.cached_property
    def owner(self) -> str:
        return owner_of(self.root_dir, self.run_base)

    def _key(self, sandbox_id: str) -> str:
        """Names the sandbox's run dir, its cgroups and its allowlist's interface."""
        return sandbox_key(self.owner, self.root_dir, sandbox_id)

    def _legacy_key(self, sandbox_id: str) -> str:
        return legacy_key(self.root_dir, sandbox_id)

    def _paths(self, sandbox_id: str) -> SandboxPaths:
        return SandboxPaths(sandbox_dir=self.root_dir / sandbox_id,
                            run_dir=self.run_base / self._key(sandbox_id))

    def _ensure_run_base(self) -> None:
        ensure_run_base(self.run_base)

    def _hidden_paths(self) -> list[Path]:
        """Directories of Orchard's own state that sandboxes on the host image must not see."""
        paths = {self.root_dir.resolve(), self.home.resolve(), orchard_home().resolve(),
                 self.bundle_cache_dir.resolve(), self.images.root.resolve()}
        return sorted(paths)

    async def _resources(self) -> tuple[str, AgentBundle]:
        if self._bwrap is None:
            self._bwrap = find_bwrap()
        if self._bundle is None:
            self._bundle = await asyncio.to_thread(ensure_agent_bundle, self.bundle_cache_dir)
        return self._bwrap, self._bundle

    @functools.cached_property
    def _spares(self) -> SpareReserve:
        return SpareReserve(self.spares, self.owner)

    async def _zygote_for(self, bundle: AgentBundle) -> Zygote:
        """The running zygote for `bundle`, started (again) when there is none."""
        if self._zygote is None or not self._zygote.alive() or self._zygote.bundle.path != bundle.path:
            if self._zygote is not None:
                await asyncio.to_thread(self._zygote.close)
            self._zygote = None
            self._zygote = await asyncio.to_thread(Zygote, bundle)
        return self._zygote

    # ---- create --------------------------------------------------------------------------------------

    async def create(self, sandbox_id: str, spec: SandboxSpec, token: str, *, owner: str = "") -> BackendSandbox:
        # bwrap binds the host's directories recursively; a mount appearing or vanishing under one of them
        # meanwhile (e.g. a container runtime's netns) fails that bind. It is transient: try again.
        try:
            for attempt in range(1, MOUNT_RACE_ATTEMPTS + 1):
                try:
                    return await self._create_once(sandbox_id, spec, token)
                except BackendError as e:
                    if attempt == MOUNT_RACE_ATTEMPTS or not any(m in str(e) for m in MOUNT_RACE_MESSAGES):
                        raise
                    await asyncio.sleep(0.05 * attempt)
            raise AssertionError("unreachable")
        finally:
            if self._zygote is not None:  # the next create's spare, made once this one is done
                self._spares.fill(self._zygote)

    async def _create_once(self, sandbox_id: str, spec: SandboxSpec, token: str) -> BackendSandbox:
        began = time.perf_counter()
        plan = await self._plan(sandbox_id, spec, token)
        spec, paths = plan.spec, plan.paths
        zygote = await self._zygote_for(plan.bundle) if zygote_wanted(plan.remap, self.zygote) else None
        try:
            paths.sandbox_dir.mkdir(mode=0o700)
        except FileExistsError:
            raise InvalidRequest(f"sandbox {sandbox_id} already exists in {self.root_dir}; delete it first "
                                 "or use another id") from None

        handle = LocalHandle(pid=0, pid_start=0, sandbox_dir=str(paths.sandbox_dir),
                             run_dir=str(paths.run_dir), socket=str(paths.socket))
        agent_url = f"unix://{paths.socket}"

        def record() -> None:
            write_record(paths.meta_file, SandboxRecord(id=sandbox_id, agent_url=agent_url, handle=handle))

        def agent_forked(pid: int) -> None:
            handle.agent_pid = pid
            record()

        def net_slot_taken(slot: int) -> None:  # recorded at once: a crash from then on still leads back to it
            handle.net_slot = slot
            record()

        spare: Spare | None = None  # with the zygote: this sandbox's cgroups, made ahead with processes in them
        network: Future[int] | None = None  # network allowlist: set up while the agent starts
        try:
            with contextlib.ExitStack() as held:  # every descriptor of the create, closed when it is done
                with contextlib.ExitStack() as handover:  # bwrap's and the agent's: closed once they have them
                    rmtree(paths.run_dir)  # a leftover of a crashed earlier sandbox of this id: the id is ours now
                    paths.run_dir.mkdir(mode=0o700)
                    listener = bind_agent_socket(paths, handover)
                    make_writable_layer(plan)
                    spare, cg = self._sandbox_cgroups(sandbox_id, spec, zygote, plan.remap, held)
                    handle.cgroups = cg.paths if cg else []
                    if spare is not None:
                        cgroups.set_limits(cg, spec)
                    require_enforceable(spec, cg)  # no limit silently weaker than asked
                    # Recorded before anything runs and again once its processes are known, so that list_live
                    # can clean up after a crash at any point (the cgroups hold every process of the sandbox).
                    record()
                    agent_argv, workload_fds = agent_command(plan, listener, cg, self.agent_apart or spec.services,
                                                             handover)
                    if spare is not None:
                        started = start_from_spare(plan, cg, agent_argv, spare, held)
                    elif zygote is not None:
                        started = start_with_zygote(plan, cg, agent_argv, workload_fds, zygote, held, handover)
                    else:
                        started = start_plain(plan, cg, agent_argv, listener, workload_fds, held)
                self._children[sandbox_id] = started.proc
                handle.pid, handle.pid_start = started.proc.pid, process_start_time(started.proc.pid) or 0
                record()  # at once: a crash from here on leaves a process that only this record leads back to
                try:
                    # bwrap reports the namespace init as soon as it exists: it is recorded with the monitor's
                    # pid while the agent starts, the long wait of a create, instead of after it.
                    info = await read_info(started.info.take(), self.ready_timeout_s)
                    namespaces_at = time.perf_counter()
                    if info.get("child-pid"):
                        handle.init_pid = int(info["child-pid"])
                        handle.init_start = process_start_time(handle.init_pid)
                    started.namespaces_made(handle.init_pid or 0)
                    record()
                    if (routed := netns.routed(spec.network)) is not None and handle.init_pid:
                        # The allowlist's veth pair and rules (netns.py), made while the agent starts.
                        network = netns.start_attach(self._key(sandbox_id), handle.init_pid, routed, net_slot_taken)
                    await started.agent_ready(self.ready_timeout_s, agent_forked)
                    listening_at = time.perf_counter()
                except TimeoutError:
                    raise BackendError(f"the agent did not start within {self.ready_timeout_s:g} s") from None
            await check_health(paths.socket, HEALTH_TIMEOUT_S)
            healthy_at = time.perf_counter()
            if network is not None:
                await asyncio.wrap_future(network)
            if plan.remap and handle.init_pid:
                protect_workload_init(handle.init_pid, handle.agent_pid)
            timings = StartupTimings(backend_create_ms=(namespaces_at - began) * 1000,
                                     agent_start_ms=(listening_at - namespaces_at) * 1000,
                                     first_health_ms=(healthy_at - listening_at) * 1000,
                                     total_ms=(time.perf_counter() - began) * 1000)
            return BackendSandbox(id=sandbox_id, agent_url=agent_url, handle=handle.model_dump(), timings=timings)
        except BaseException as e:
            # The create's descriptors are closed by now (`held`); what it made goes.
            if network is not None:
                network.exception()  # waits: what it made is recorded before it is removed
            agent_log = tail(paths.log_file)
            self._destroy(sandbox_id, handle)
            if spare is not None:  # its shell, killed with the cgroups: reaped (launched or not)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spare.proc.wait(timeout=5)
            if isinstance(e, (BackendError, OSError)):
                raise BackendError(f"sandbox {sandbox_id} failed to start: {e}"
                                   + (f"; agent output: {agent_log}" if agent_log else "")) from e
            raise

    async def _plan(self, sandbox_id: str, spec: SandboxSpec, token: str) -> Plan:
        """The create's checks, and what it settles before it makes anything of the sandbox (the run base
        and Orchard's own directories aside: made private)."""
        if not SANDBOX_ID.fullmatch(sandbox_id):
            raise InvalidRequest(f"sandbox id {sandbox_id!r} is not valid: use 1-128 letters, digits, "
                                 "'_', '.' or '-', starting with a letter or digit")
        validate_network(spec)
        gateway_socket = gateway_socket_for(spec, self.gateway_socket)
        validate_disk(spec)
        check_cpu_floor(spec)
        rootfs = validate_image(spec, self.images)
        spec = with_image_env(spec, self.images)
        harness_bundles = [(built.manifest.spec.name, built.path)
                           for built in require_built(spec.bundles, self.bundle_cache_dir)]
        bwrap, bundle = await self._resources()
        env = agent_env(shares_host_network(spec))  # the agent's own: nothing of the spec's or the image's
        commands_env = encode_workload_env(workload_env(spec, rootfs))
        paths = self._paths(sandbox_id)
        if len(str(paths.socket).encode()) > MAX_SOCKET_PATH:
            raise BackendError(f"the agent socket path {paths.socket} is longer than {MAX_SOCKET_PATH} "
                               "bytes; pass a shorter run_dir to LocalBackend (or set TMPDIR)")
        self._ensure_run_base()
        make_private(self.root_dir, {self.home, orchard_home()})
        remap = remaps_ids()
        # Sandboxes of root map host root, who owns the bundles: their host directories are locked
        # read-only in the sandbox (launch.LOCK_SCRIPT), so nothing there can ever write them.
        read_only = outermost([bundle.path.parent, *(path for _, path in harness_bundles)]) if remap else []
        return Plan(sandbox_id=sandbox_id, spec=spec, token=token, rootfs=rootfs, paths=paths, bwrap=bwrap,
                    bundle=bundle, env=env, commands_env=commands_env, gateway_socket=gateway_socket,
                    harness_bundles=harness_bundles, hidden=self._hidden_paths(), remap=remap,
                    read_only=read_only)

    def _sandbox_cgroups(self, sandbox_id: str, spec: SandboxSpec, zygote: Zygote | None, split: bool,
                         held: contextlib.ExitStack) -> tuple[Spare | None, CgroupSet | None]:
        """The sandbox's cgroups: a ready spare's, renamed to its key (the spare then starts the sandbox,
        `start_from_spare`; the caller writes the spec's limits), else made now (None: none can be here)."""
        spare = self._spares.take(zygote) if zygote is not None else None
        if spare is not None:
            try:
                groups = cgroups.rename_cgroups(spare.groups, self._key(sandbox_id))
            except OSError as e:  # a leftover of an earlier sandbox of this id holds the name
                log.info("a spare's cgroups could not take sandbox %s's name (%s): making its own", sandbox_id, e)
                spare.discard()
            else:
                held.callback(spare.close_fds)  # what we hold of it; its processes go with the cgroups
                return spare, groups
        return None, cgroups.create_cgroups(self._key(sandbox_id), spec, split=split)

    # ---- delete / liveness ---------------------------------------------------------------------------

    async def delete(self, sandbox: BackendSandbox) -> None:
        handle = handle_of(sandbox) or self._handle_from_disk(sandbox.id)
        if handle is None:
            return
        await asyncio.to_thread(self._destroy, sandbox.id, handle)

    def _handle_from_disk(self, sandbox_id: str) -> LocalHandle | None:
        return handle_from_disk(self._paths(sandbox_id)) if SANDBOX_ID.fullmatch(sandbox_id) else None

    def _destroy(self, sandbox_id: str, handle: LocalHandle) -> None:
        """Kill every process, then remove cgroups and files (teardown.py). Safe to repeat; blocking (short)."""
        destroy(sandbox_id, handle, self._key(sandbox_id), self._legacy_key(sandbox_id),
                self._children.pop(sandbox_id, None))

    async def is_alive(self, sandbox: BackendSandbox) -> bool:
        handle = handle_of(sandbox)
        if handle is None:
            return False
        pid, start = ((handle.init_pid, handle.init_start) if handle.init_pid
                      else (handle.pid, handle.pid_start))
        if not process_running(pid, start):
            return False
        try:
            _, writer = await asyncio.wait_for(asyncio.open_unix_connection(handle.socket), 2.0)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def list_live(self) -> list[BackendSandbox]:
        """Running sandboxes under root_dir (from their meta.json). Leftovers of dead ones (the machine
        or the orchestrator was killed) are removed on the way, so nothing accumulates."""
        live = []
        entries = sorted(self.root_dir.iterdir()) if self.root_dir.is_dir() else []
        for entry in entries:
            if not entry.is_dir() or not SANDBOX_ID.fullmatch(entry.name):
                continue
            record = read_record(entry / "meta.json")
            if record is None:
                try:
                    age = time.time() - entry.stat().st_mtime
                except FileNotFoundError:
                    continue
                if age > STALE_UNRECORDED_S:
                    handle = self._handle_from_disk(entry.name)
                    if handle is not None:
                        await asyncio.to_thread(self._destroy, entry.name, handle)
                continue
            h = record.handle
            if process_running(h.pid, h.pid_start) or process_running(h.init_pid, h.init_start):
                live.append(BackendSandbox(id=record.id, agent_url=record.agent_url, handle=h.model_dump()))
            elif not h.pid and file_age(entry / "meta.json") < STALE_UNRECORDED_S:
                continue  # recorded before its processes start: a create in progress (of any process)
            else:
                log.info("removing leftovers of dead local sandbox %s", record.id)
                await asyncio.to_thread(self._destroy, record.id, h)
        # Groups of this backend's sandboxes whose dirs were removed under them (a run dir exists from
        # before a sandbox's cgroups are made until after they are removed). Only groups named by this
        # backend's keys: another backend's create in progress has its run dir elsewhere.
        def in_use() -> set[str]:  # read after the groups are listed: a create makes its run dir first
            made = set(os.listdir(self.run_base)) if self.run_base.is_dir() else set()
            return made | self._spares.names()  # (a spare's groups are empty until its shell moves in)

        for group in await asyncio.to_thread(cgroups.remove_abandoned_groups, in_use, f"{self.owner}-"):
            log.info("removed abandoned cgroup %s", group)
        for slot in await asyncio.to_thread(netns.clean_orphans):
            log.info("removed the allowlist rules of dead sandbox slot %d", slot)
        return live

    async def close(self) -> None:
        """Stops the zygote; sandboxes keep running by design, and their state is on disk."""
        self._children.clear()
        await asyncio.to_thread(self._spares.close)
        if self._zygote is not None:
            zygote, self._zygote = self._zygote, None
            await asyncio.to_thread(zygote.close)

