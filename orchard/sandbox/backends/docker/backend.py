"""The docker backend: one container per sandbox on a Docker Engine API (Docker, or Podman's
Docker-compatible socket) on this machine; the daemon is only the control plane — exec and files go
straight to the agent.

Per sandbox (labelled `orchard.dev/sandbox=<id>`, `orchard.dev/instance=<instance>`, with owner, deadline
and host directory as labels too: they are how `list_live` re-adopts it after a restart):
- container `orchard-<instance>-<id>` from the user's image, its entrypoint replaced by the agent started
  through the bundled loader; the agent bundle bind-mounted read-only at /.orchard, the token as a
  read-only file, network `none` (loopback only) or the daemon's bridge (`open`); cpu, memory (no swap)
  and processes as cgroup limits;
- a host directory (dirs.py) where the agent's Unix socket appears: the orchestrator reaches the
  agent through it whatever the network mode, so `none` really has no interface but loopback.
Blocking Engine API calls run in a thread pool. See docs/docker.md."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchard.core.backend import BackendSandbox
from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import SandboxSpec, StartupTimings
import orchard.sandbox.backends.docker.containers as spec_of
from orchard.sandbox.backends.docker.config import DockerConfig, default_run_dir, docker_capabilities
from orchard.sandbox.backends.docker.dirs import SandboxDir, ensure_private_dir, instance_key, sandbox_key
from orchard.sandbox.backends.docker.engine import Engine
from orchard.sandbox.backends.agent_health import check_health
from orchard.sandbox.backends.gateway_socket import configured_socket, socket_for
from orchard.sandbox.bundle import AgentBundle, default_cache_dir, ensure_agent_bundle
from orchard.sandbox.harness_bundles.store import require_built

log = logging.getLogger(__name__)

# A container that never started (a create that crashed between create and start), or a host directory
# without its container, this old is a leftover.
STALE_LEFTOVER_S = 120.0
# A sandbox whose orchestrator has been gone this long past its deadline is removed by list_live.
DEADLINE_MARGIN_S = 300.0
HEALTH_TIMEOUT_S = 5.0
STATE_CHECK_EVERY_S = 0.25


class DockerBackend:
    """Options: `DockerConfig` (docs/docker.md)."""

    name = "docker"
    Config = DockerConfig

    def __init__(self, config: DockerConfig | None = None) -> None:
        self.config = config = config or DockerConfig()
        spec_of.validate_instance(config.instance)
        self.gateway_socket = configured_socket(config.model_gateway, "docker")  # network.gateway's
        self.capabilities = docker_capabilities(config.disk_quota, config.default_image,
                                                model_gateway=self.gateway_socket is not None)
        self.instance = config.instance
        self.run_base = Path(config.run_dir) if config.run_dir else default_run_dir()
        self.instance_dir = self.run_base / instance_key(config.instance)
        self.bundle_cache_dir = Path(config.bundle_cache_dir) if config.bundle_cache_dir else default_cache_dir()
        self._executor = ThreadPoolExecutor(max_workers=config.max_parallel + 4, thread_name_prefix="orchard-docker")
        self._burst = asyncio.Semaphore(config.max_parallel)
        self._setup_lock = asyncio.Lock()
        self._engine: Engine | None = None
        self._bundle: AgentBundle | None = None

    @classmethod
    def from_config(cls, config: DockerConfig) -> "DockerBackend":
        return cls(config)

    async def _call(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(fn, *args, **kwargs))

    async def _setup(self) -> Engine:
        if self._engine is None:
            async with self._setup_lock:
                if self._engine is None:
                    engine = await self._call(Engine.connect, self.config.base_url, self.config.max_parallel + 4)
                    self._bundle = await self._call(ensure_agent_bundle, self.bundle_cache_dir)
                    self._engine = engine
        return self._engine

    def _dir(self, sandbox_id: str, recorded: str | None = None) -> SandboxDir:
        """The sandbox's host directory: where a handle or label says (the run_dir may have changed since),
        if that is a directory of this sandbox's key, else where this config puts it."""
        key = sandbox_key(self.instance, sandbox_id)
        if recorded and Path(recorded).is_absolute() and Path(recorded).name == key:
            return SandboxDir(Path(recorded))
        return SandboxDir(self.instance_dir / key)

    # --- create ----------------------------------------------------------------------------------------

    async def create(self, sandbox_id: str, spec: SandboxSpec, token: str, *, owner: str = "") -> BackendSandbox:
        spec_of.validate_sandbox_id(sandbox_id)
        self.capabilities.check(spec, self.name)
        spec_of.validate_limits(spec)
        image = spec_of.resolve_image(spec, self.config.default_image)
        gateway_socket = socket_for(spec, self.gateway_socket, self.name)
        harness_bundles = [(built.manifest.spec.name, built.path)
                           for built in require_built(spec.bundles, self.bundle_cache_dir)]
        engine = await self._setup()
        assert self._bundle is not None
        name = spec_of.container_name(self.instance, sandbox_id)
        begun = time.monotonic()
        async with self._burst:
            await self._call(engine.ensure_image, image, self.config.pull)
            sandbox_dir = await self._call(self._make_dir, engine, sandbox_id, name, token)
        container_id = None
        deadline = time.monotonic() + self.config.ready_timeout_s
        try:
            host_options = spec_of.host_config_options(
                spec, bundle=self._bundle, token_file=str(sandbox_dir.token), sock_dir=str(sandbox_dir.sock_dir),
                init=self.config.init, runtime=self.config.runtime, disk_quota=self.config.disk_quota,
                harness_bundles=harness_bundles, gateway_socket=gateway_socket)
            labels = spec_of.labels(sandbox_id, self.instance, owner, spec, str(sandbox_dir.path))
            options = spec_of.container_options(sandbox_id, spec, image, bundle=self._bundle, container_labels=labels,
                                                gateway=gateway_socket is not None)
            async with self._burst:
                container_id = await self._call(engine.create_and_start, name, options, host_options)
            running = time.monotonic()
            await self._wait_for_agent(engine, container_id, name, sandbox_dir, deadline)
            healthy = time.monotonic()
            handle = spec_of.DockerHandle(container_id=container_id, name=name, run_dir=str(sandbox_dir.path),
                                          owner=owner, deadline=float(labels[spec_of.DEADLINE_LABEL]))
            # Image, directory and container started; then until the agent's first health answer (its start
            # included: the engine does not show it apart).
            timings = StartupTimings(backend_create_ms=(running - begun) * 1000,
                                     first_health_ms=(healthy - running) * 1000, total_ms=(healthy - begun) * 1000)
            return BackendSandbox(id=sandbox_id, agent_url=sandbox_dir.agent_url, handle=handle.model_dump(),
                                  timings=timings)
        except BaseException:
            # Only what this create made: a container of that name that it did not make is someone else's
            # (a create cancelled mid-call leaves at most a never-started container, which list_live removes).
            await asyncio.shield(self._call(self._remove, engine, container_id, sandbox_dir))
            raise

    def _make_dir(self, engine: Engine, sandbox_id: str, name: str, token: str) -> SandboxDir:
        """The sandbox's host directory, made exclusively: a second create of the same id fails here,
        before it could touch the first one's container."""
        ensure_private_dir(self.run_base)
        self.instance_dir.mkdir(mode=0o700, exist_ok=True)
        sandbox_dir = self._dir(sandbox_id)
        try:
            sandbox_dir.make(token)
        except FileExistsError:
            if engine.inspect(name) is not None:
                raise InvalidRequest(f"sandbox {sandbox_id} already exists (container {name}); delete it first "
                                     "or use another id") from None
            sandbox_dir.remove()  # the leftover of a crashed create of this id
            sandbox_dir.make(token)
        return sandbox_dir

    async def _wait_for_agent(self, engine: Engine, container_id: str, name: str, sandbox_dir: SandboxDir,
                              deadline: float) -> None:
        """Until the agent's /health answers on its socket; the container's exit ends the wait at once with
        what the agent printed."""
        delay, next_state_check, error = 0.005, 0.0, None
        while True:
            try:
                if sandbox_dir.link_socket():
                    await check_health(sandbox_dir.socket, HEALTH_TIMEOUT_S)
                    return
            except (OSError, BackendError) as e:
                error = e  # refused while the agent is between bind() and listen()
            now = time.monotonic()
            if now >= next_state_check:
                next_state_check = now + STATE_CHECK_EVERY_S
                state = await self._call(engine.state, container_id)
                if state is None or not state.get("Running"):
                    logs = await self._call(engine.logs_tail, container_id)
                    exit_code = (state or {}).get("ExitCode")
                    raise BackendError(f"container {name} exited (code {exit_code}) before its agent was ready"
                                       + (f"; its output: {logs}" if logs else "")
                                       + ("" if state else " (the container is gone)"))
            if now + delay > deadline:
                raise BackendError(f"the agent of container {name} did not answer on {sandbox_dir.socket} within "
                                   f"{self.config.ready_timeout_s:g} s (last error: {error}); `docker logs {name}` "
                                   "may say why")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    # --- delete / liveness / discovery -----------------------------------------------------------------

    def _remove(self, engine: Engine, container: str | None, sandbox_dir: SandboxDir) -> None:
        if container:
            engine.remove(container)
        sandbox_dir.remove()

    async def delete(self, sandbox: BackendSandbox) -> None:
        engine = await self._setup()
        handle = _handle_of(sandbox)
        container = handle.container_id if handle else spec_of.container_name(self.instance, sandbox.id)
        sandbox_dir = self._dir(sandbox.id, handle.run_dir if handle else None)
        async with self._burst:
            await self._call(self._remove, engine, container, sandbox_dir)

    async def is_alive(self, sandbox: BackendSandbox) -> bool:
        engine = await self._setup()
        handle = _handle_of(sandbox)
        state = await self._call(engine.state, handle.container_id if handle else
                                 spec_of.container_name(self.instance, sandbox.id))
        return bool(state and state.get("Running"))

    async def list_live(self) -> list[BackendSandbox]:
        """This instance's running containers, from their labels. Exited ones, ones past their deadline
        by DEADLINE_MARGIN_S, never-started ones and host directories without a container are removed."""
        engine = await self._setup()
        containers = await self._call(engine.list, spec_of.instance_filters(self.instance))
        live, dead, dirs_in_use, now = [], [], set(), time.time()
        for c in containers:
            labels = c.get("Labels") or {}
            sandbox_id, run_dir = labels.get(spec_of.SANDBOX_LABEL), labels.get(spec_of.RUN_DIR_LABEL)
            if not sandbox_id or not run_dir:
                continue
            dirs_in_use.add(Path(run_dir).name)
            deadline = _float(labels.get(spec_of.DEADLINE_LABEL))
            created = _float(labels.get(spec_of.CREATED_LABEL))
            if c.get("State") == "running" and not (deadline and now > deadline + DEADLINE_MARGIN_S):
                handle = spec_of.DockerHandle(container_id=c["Id"], name=(c.get("Names") or ["/"])[0].lstrip("/"),
                                              run_dir=run_dir, owner=labels.get(spec_of.OWNER_LABEL, ""),
                                              deadline=deadline)
                live.append(BackendSandbox(id=sandbox_id, agent_url=self._dir(sandbox_id, run_dir).agent_url,
                                           handle=handle.model_dump()))
            elif c.get("State") != "created" or now - created > STALE_LEFTOVER_S:
                dead.append((sandbox_id, c["Id"], self._dir(sandbox_id, run_dir)))
        for sandbox_id, container_id, sandbox_dir in dead:
            log.info("removing dead docker sandbox %s (container %s)", sandbox_id, container_id[:12])
            await self._call(self._remove, engine, container_id, sandbox_dir)
        await self._call(self._remove_orphan_dirs, dirs_in_use)
        return live

    def _remove_orphan_dirs(self, in_use: set[str]) -> None:
        if not self.instance_dir.is_dir():
            return
        for entry in self.instance_dir.iterdir():
            try:
                old = time.time() - entry.stat().st_mtime > STALE_LEFTOVER_S
            except FileNotFoundError:
                continue
            if entry.name not in in_use and old:
                log.info("removing %s: no container of this instance uses it", entry)
                SandboxDir(entry).remove()

    async def close(self) -> None:
        """Close the Engine API connections; sandboxes keep running (a restart re-adopts them)."""
        if self._engine is not None:
            await self._call(self._engine.close)
            self._engine = None
        self._executor.shutdown(wait=False, cancel_futures=True)


def _handle_of(sandbox: BackendSandbox) -> spec_of.DockerHandle | None:
    try:
        return spec_of.DockerHandle.model_validate(sandbox.handle)
    except ValueError:
        return None


def _float(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0
