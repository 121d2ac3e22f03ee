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
re-adopt them through `list_live`. See docs/local-backend.md."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import re
import socket
import stat
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
from orchard.sandbox.backends.local.bwrap import (AGENT_USER, INIT_USER, REMAP_BASE, SANDBOX_USER, SandboxPaths,
                                                  agent_env, bwrap_args, encode_workload_env, id_map,
                                                  remaps_ids, validate_disk, validate_image, validate_network,
                                                  with_image_env, workload_env)
from orchard.sandbox.backends.local.config import AGENT_APART_ENV, LocalConfig, local_capabilities
from orchard.sandbox.backends.local.gateway import agent_gateway_args, gateway_socket_for, model_gateway_socket
from orchard.sandbox.backends.local.launch import (launch_argv, launch_command, limit_lines, protect_workload_init,
                                                   read_info, release_userns, spawn, wait_ready_line,
                                                   writable_subdirs)
from orchard.sandbox.backends.local.limits import check_cpu_floor, require_enforceable
from orchard.sandbox.backends.local.procs import (file_age, fds_named_in, kill, never_readable_fd, rmtree, tail,
                                                  wait_gone)
from orchard.sandbox.backends.local.spares import Spare, SpareReserve
from orchard.sandbox.backends.local.zygote import Zygote, ZygoteEntry, begin_entry, read_ready, zygote_wanted
from orchard.sandbox.backends.local.state import (LocalHandle, SandboxRecord, children_of,
                                                  process_running, process_start_time, read_record,
                                                  write_record)
from orchard.sandbox.bubblewrap import find_bwrap
from orchard.sandbox.bundle import AgentBundle, default_cache_dir, ensure_agent_bundle
from orchard.sandbox.images import ImageStore
from orchard.sandbox.harness_bundles.store import require_built

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

    # ---- paths ---------------------------------------------------------------------------------------

    @functools.cached_property
    def owner(self) -> str:
        """8 hex of (root_dir, run_dir), the start of every key (`<owner>-`): the sweep for abandoned cgroups
        takes only groups named so, never those of another backend on this machine (another home, another
        orchestrator), whose creates in progress it cannot see."""
        where = f"{self.root_dir.resolve()}\0{self.run_base.resolve()}"
        return hashlib.sha256(where.encode()).hexdigest()[:8]

    def _key(self, sandbox_id: str) -> str:
        """Short, unique per (root_dir, run_dir, id): names the run dir, the cgroups and the allowlist's
        interface."""
        sandbox = hashlib.sha256(f"{self.root_dir.resolve()}\0{sandbox_id}".encode()).hexdigest()[:16]
        return f"{self.owner}-{sandbox}"

    def _legacy_key(self, sandbox_id: str) -> str:
        """The key before it named its owner: a sandbox made by an earlier version and interrupted before
        it recorded its cgroups has them under this name."""
        return hashlib.sha256(f"{self.root_dir.resolve()}\0{sandbox_id}".encode()).hexdigest()[:20]

    def _paths(self, sandbox_id: str) -> SandboxPaths:
        return SandboxPaths(sandbox_dir=self.root_dir / sandbox_id,
                            run_dir=self.run_base / self._key(sandbox_id))

    def _ensure_run_base(self) -> None:
        """The run base is shared by everyone's sandboxes of this uid in a world-writable /tmp: refuse it
        unless it is our own private directory."""
        self.run_base.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(self.run_base)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(self.run_base, 0o700)  # ours, merely too open (umask): tighten it
            st = os.lstat(self.run_base)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise BackendError(f"{self.run_base} must be a directory owned by uid {os.getuid()} with mode "
                               "0700; remove it or pass another run_dir to LocalBackend")

    def _hidden_paths(self) -> list[Path]:
        """Directories of Orchard's own state that sandboxes on the host image must not see."""
        paths = {self.root_dir.resolve(), self.home.resolve(), orchard_home().resolve(),
                 self.bundle_cache_dir.resolve(), self.images.root.resolve()}
        return sorted(paths)

    def _make_private(self) -> None:
        """Orchard's state (every sandbox's files; in the home, the state db with live tokens) is 0700:
        sandboxes of root run as an unprivileged host uid, so the mode is what keeps them out of the
        homes of *other* orchestrators too, which no tmpfs cover of this one hides."""
        self.root_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        homes = {self.home, orchard_home()}
        if self.root_dir.name == "sandboxes":  # the layout of an Orchard home: <home>/sandboxes
            homes.add(self.root_dir.parent)
        for path in (self.root_dir, *homes):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if st.st_uid == os.getuid() and st.st_mode & 0o077:
                    os.chmod(path, st.st_mode & 0o7700)

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
        started = time.perf_counter()
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
        env = agent_env()  # the agent's own: nothing of the spec's or the image's
        commands_env = encode_workload_env(workload_env(spec, rootfs))
        paths = self._paths(sandbox_id)
        if len(str(paths.socket).encode()) > MAX_SOCKET_PATH:
            raise BackendError(f"the agent socket path {paths.socket} is longer than {MAX_SOCKET_PATH} "
                               "bytes; pass a shorter run_dir to LocalBackend (or set TMPDIR)")
        self._ensure_run_base()
        self._make_private()
        remap = remaps_ids()
        # Sandboxes of root map host root, who owns the bundles: their host directories are locked
        # read-only in the sandbox (launch.LOCK_SCRIPT), so nothing there can ever write them.
        read_only = _outermost([bundle.path.parent, *(path for _, path in harness_bundles)]) if remap else []
        zygote = await self._zygote_for(bundle) if zygote_wanted(remap, self.zygote) else None
        try:
            paths.sandbox_dir.mkdir(mode=0o700)
        except FileExistsError:
            raise InvalidRequest(f"sandbox {sandbox_id} already exists in {self.root_dir}; delete it first "
                                 "or use another id") from None

        handle = LocalHandle(pid=0, pid_start=0, sandbox_dir=str(paths.sandbox_dir),
                             run_dir=str(paths.run_dir), socket=str(paths.socket))
        agent_url = f"unix://{paths.socket}"
        listener: socket.socket | None = None
        hold_fd: int | None = None  # with the zygote: what bwrap's init blocks on instead of running the agent
        agent_fds: list[tuple[int, int]] = []  # with the zygote: (number in the agent, our copy)
        entry: ZygoteEntry | None = None  # with the zygote: the agent on its way
        ready_r: int | None = None  # with the zygote: where the agent's READY line comes
        workload_fds: list[int] = []
        userns_w: int | None = None  # bwrap waits on this for its user namespace's id maps
        network: Future[int] | None = None  # network allowlist: set up while the agent starts
        spare: Spare | None = None  # with the zygote: this sandbox's cgroups, made ahead with processes in them
        info_r: int | None = None  # bwrap's --info-fd, until read
        try:
            rmtree(paths.run_dir)  # a leftover of a crashed earlier sandbox of this id: the id is ours now
            paths.run_dir.mkdir(mode=0o700)
            # The agent's socket is bound here, where only the host can reach: the sandbox gets the open
            # listening socket, never a directory it could fill or a path it could swap.
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(paths.socket))
            listener.listen(128)
            paths.writable_dir.mkdir()
            if not spec.disk_mb:  # else they are made on the tmpfs, inside the sandbox's mount namespace
                plain, sticky = writable_subdirs(rootfs)
                for sub in plain + sticky:
                    (paths.writable_dir / sub).mkdir()
                    if sub in sticky:
                        os.chmod(paths.writable_dir / sub, 0o1777)
                    if remap:  # the sandbox's root owns its writable layer
                        os.chown(paths.writable_dir / sub, REMAP_BASE, REMAP_BASE)
            spare = self._spares.take(zygote) if zygote is not None else None
            cg = self._adopt(spare, sandbox_id) if spare is not None else None
            if cg is None:
                spare = None
                cg = cgroups.create_cgroups(self._key(sandbox_id), spec, split=remap)
            handle.cgroups = cg.paths if cg else []
            if spare is not None:
                cgroups.set_limits(cg, spec)
            require_enforceable(spec, cg)  # no limit silently weaker than asked
            # Recorded before anything runs and again once its processes are known, so that list_live can
            # clean up after a crash at any point (the cgroups hold every process of the sandbox).
            write_record(paths.meta_file, SandboxRecord(id=sandbox_id, agent_url=agent_url, handle=handle))

            agent_argv = bundle.launch_argv(listen=f"fd:{listener.fileno()}", workdir=spec.workdir)
            if remap:
                agent_argv += ["--user", SANDBOX_USER, "--init-user", INIT_USER]
                if self.agent_apart:
                    agent_argv += ["--agent-user", AGENT_USER]
            agent_argv += agent_gateway_args(gateway_socket)
            # Opened here, as host root: the agent puts its commands' spawner into `workload` through them.
            for procs in cg.workload_procs_files if cg else []:
                workload_fds.append(os.open(procs, os.O_WRONLY | os.O_CLOEXEC))
            if workload_fds:
                agent_argv += ["--workload-cgroup-fds", ",".join(map(str, workload_fds))]
            owner = f"{REMAP_BASE}:{REMAP_BASE}" if remap else ""
            # With the zygote, bwrap gets a pipe to block on (never written: it holds a write end of its
            # own) in the place of the agent's socket, which goes to the zygote instead.
            hold_fd = never_readable_fd() if zygote is not None and spare is None else None
            hold_number = spare.hold_number if spare is not None else hold_fd  # bwrap has it at this number

            def make_bwrap_args(info_fd: int, token_fd: int, block_fd: int | None, env_fd: int) -> list[str]:
                return bwrap_args(spec, rootfs, paths, bundle.path, sandbox_id[:63], env, info_fd, token_fd,
                                  hidden=self._hidden_paths(), userns_block_fd=block_fd,
                                  gateway_socket=gateway_socket, harness_bundles=harness_bundles,
                                  hold_fd=hold_number, env_fd=env_fd)

            if spare is not None:  # bwrap from the spare's shell, in the cgroups already
                proc, info_r, userns_w = spare.launch(
                    make_bwrap_args(spare.info_number, spare.token_fd, spare.block_number, spare.env_fd),
                    launch_command(bwrap, spare.args_fd, agent_argv, spec, rootfs, paths, owner, read_only),
                    limit_lines(spec, cg), paths.log_file, token, commands_env)
            else:
                proc, info_r, userns_w = spawn(
                    lambda args_fd: launch_argv(bwrap, args_fd, agent_argv, spec, rootfs, paths, cg, owner,
                                                read_only),
                    make_bwrap_args, paths, token, hold_fd if hold_fd is not None else listener.fileno(),
                    commands_env, block_userns=remap, keep_fds=tuple(workload_fds))
            if zygote is not None:  # copies of the agent's descriptors, for the zygote to hand it
                if hold_fd is not None:
                    os.close(hold_fd)
                    hold_fd = None
                agent_fds = [(n, os.dup(n)) for n in fds_named_in(agent_argv)]
                # Sent now: the zygote's child forks and joins the cgroups while bwrap makes the namespaces
                # (a spare's child is in them already).
                entry, ready_r = begin_entry(zygote, spec, rootfs, env, cg, agent_argv, hold_number or 0,
                                             agent_fds, paths, bundle,
                                             parked=spare.parked if spare is not None else None)
                if spare is not None:
                    spare.parked.close()
                for _, fd in agent_fds:
                    os.close(fd)  # (the zygote has its own copies)
                agent_fds = []
            listener.close()  # the agent (or, with the zygote, our copy) has it now
            for fd in workload_fds:
                os.close(fd)
            workload_fds = []
            self._children[sandbox_id] = proc
            handle.pid, handle.pid_start = proc.pid, process_start_time(proc.pid) or 0
            # At once: a crash from here on leaves a process that only this record leads back to.
            write_record(paths.meta_file, SandboxRecord(id=sandbox_id, agent_url=agent_url, handle=handle))
            try:
                # bwrap reports the namespace init as soon as it exists: it is recorded with the monitor's
                # pid while the agent starts, the long wait of a create, instead of after it.
                fd, info_r = info_r, None
                info = await read_info(fd, self.ready_timeout_s)  # (closes it)
                namespaces_at = time.perf_counter()
                if info.get("child-pid"):
                    handle.init_pid = int(info["child-pid"])
                    handle.init_start = process_start_time(handle.init_pid)
                if entry is not None:
                    entry.provide(handle.init_pid or 0)
                if userns_w is not None:
                    block, userns_w = userns_w, None
                    if handle.init_pid:
                        release_userns(handle.init_pid, block, id_map())
                    else:
                        os.close(block)  # bwrap failed before its namespaces: it exits, saying why
                write_record(paths.meta_file, SandboxRecord(id=sandbox_id, agent_url=agent_url, handle=handle))
                if netns.routed(spec.network) is not None and handle.init_pid:
                    network = self._start_network(sandbox_id, spec, handle, agent_url)
                if entry is not None and ready_r is not None:
                    handle.agent_pid = await entry.agent_pid(self.ready_timeout_s)
                    entry.close()
                    entry = None
                    write_record(paths.meta_file, SandboxRecord(id=sandbox_id, agent_url=agent_url, handle=handle))
                    fd, ready_r = ready_r, None
                    await read_ready(fd, self.ready_timeout_s)
                else:
                    await wait_ready_line(proc, self.ready_timeout_s)
                listening_at = time.perf_counter()
            except TimeoutError:
                raise BackendError(f"the agent did not start within {self.ready_timeout_s:g} s") from None
            await check_health(paths.socket, HEALTH_TIMEOUT_S)
            healthy_at = time.perf_counter()
            if network is not None:
                await asyncio.wrap_future(network)
            if remap and handle.init_pid:
                protect_workload_init(handle.init_pid, handle.agent_pid)
            timings = StartupTimings(backend_create_ms=(namespaces_at - started) * 1000,
                                     agent_start_ms=(listening_at - namespaces_at) * 1000,
                                     first_health_ms=(healthy_at - listening_at) * 1000,
                                     total_ms=(time.perf_counter() - started) * 1000)
            return BackendSandbox(id=sandbox_id, agent_url=agent_url, handle=handle.model_dump(), timings=timings)
        except BaseException as e:
            if spare is not None:
                spare.close_fds()  # its processes are in the sandbox's cgroups: removed with them below
            if listener is not None:
                listener.close()
            for _, fd in agent_fds:
                os.close(fd)
            if entry is not None:
                entry.close()
            if ready_r is not None:
                os.close(ready_r)
            if hold_fd is not None:
                os.close(hold_fd)
            for fd in workload_fds:
                os.close(fd)
            if userns_w is not None:
                os.close(userns_w)
            if info_r is not None:
                os.close(info_r)
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

    def _adopt(self, spare: Spare, sandbox_id: str) -> cgroups.CgroupSet | None:
        """The spare's groups renamed to the sandbox's key; None (the spare discarded) when they cannot be
        (a leftover of an earlier sandbox of this id holds the name): the create makes its own then."""
        try:
            return cgroups.rename_cgroups(spare.groups, self._key(sandbox_id))
        except OSError as e:
            log.info("a spare's cgroups could not take sandbox %s's name (%s): making its own", sandbox_id, e)
            spare.discard()
            return None

    def _start_network(self, sandbox_id: str, spec: SandboxSpec, handle: LocalHandle,
                       agent_url: str) -> "Future[int]":
        """The allowlist's veth pair and rules (netns.py), made while the agent starts; the slot is
        recorded the moment it is taken, so that a crash from then on still leads back to it."""
        meta_file = self._paths(sandbox_id).meta_file

        def record(slot: int) -> None:
            handle.net_slot = slot
            write_record(meta_file, SandboxRecord(id=sandbox_id, agent_url=agent_url, handle=handle))

        routed = netns.routed(spec.network)
        assert routed is not None
        return netns.start_attach(self._key(sandbox_id), handle.init_pid or 0, routed, record)

    # ---- delete / liveness ---------------------------------------------------------------------------

    async def delete(self, sandbox: BackendSandbox) -> None:
        handle = _handle_of(sandbox) or self._handle_from_disk(sandbox.id)
        if handle is None:
            return
        await asyncio.to_thread(self._destroy, sandbox.id, handle)

    def _handle_from_disk(self, sandbox_id: str) -> LocalHandle | None:
        if not SANDBOX_ID.fullmatch(sandbox_id):
            return None
        record = read_record(self._paths(sandbox_id).meta_file)
        if record is not None:
            return record.handle
        paths = self._paths(sandbox_id)
        if paths.sandbox_dir.exists() or paths.run_dir.exists():
            return LocalHandle(pid=0, pid_start=0, sandbox_dir=str(paths.sandbox_dir),
                               run_dir=str(paths.run_dir), socket=str(paths.socket))
        return None

    def _destroy(self, sandbox_id: str, handle: LocalHandle) -> None:
        """Kill every process, then remove cgroups and files. Safe to repeat; blocking (short)."""
        # An allowlist's slot that a crash left unrecorded is found by its interface, which dies with the
        # sandbox: look before the kill.
        net_slot = handle.net_slot
        if net_slot is None:
            net_slot = netns.find_slot(self._key(sandbox_id))
        proc = self._children.pop(sandbox_id, None)
        monitor_alive = process_running(handle.pid, handle.pid_start)
        if process_running(handle.init_pid, handle.init_start):
            # SIGKILL to a pid namespace's init kills every process in that namespace.
            kill(handle.init_pid)
        elif monitor_alive:
            # bwrap's report never arrived (crash mid-create): its children are the namespace init, and
            # the monitor may not have got as far as making one.
            for child in children_of(handle.pid):
                kill(child)
            kill(handle.pid)
        if monitor_alive:
            wait_gone(handle.pid, handle.pid_start, proc, timeout=5.0)
        # A create killed before it recorded its groups left them unrecorded: they are found by name.
        left = cgroups.kill_and_remove(handle.cgroups or cgroups.existing_groups(self._key(sandbox_id))
                                       or cgroups.existing_groups(self._legacy_key(sandbox_id)))
        if proc is not None and proc.returncode is None:
            proc.wait()
        network_error = None
        try:  # after the kill: nothing of the sandbox runs while its network goes
            netns.detach(self._key(sandbox_id), net_slot)
        except BackendError as e:
            network_error = e
        for path in (handle.run_dir, handle.sandbox_dir):
            rmtree(Path(path))
        if network_error is not None:
            raise BackendError(f"sandbox {sandbox_id}: its network allowlist could not be removed: "
                               f"{network_error}") from network_error
        if left:
            raise BackendError(f"sandbox {sandbox_id}: cgroups {', '.join(left)} could not be removed; "
                               "some process in them did not die — check `cat <group>/cgroup.procs`")

    async def is_alive(self, sandbox: BackendSandbox) -> bool:
        handle = _handle_of(sandbox)
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


def _outermost(paths: list[Path]) -> list[Path]:
    """`paths` without those inside another of them (binding that one read-only covers them)."""
    paths = sorted({p.resolve() for p in paths})
    return [p for p in paths if not any(other in p.parents for other in paths)]


def _handle_of(sandbox: BackendSandbox) -> LocalHandle | None:
    try:
        return LocalHandle.model_validate(sandbox.handle)
    except ValueError:
        return None
