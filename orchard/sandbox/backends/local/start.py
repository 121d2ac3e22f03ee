"""How a local sandbox's processes start: three paths, a function each (docs/local-backend.md#start-path).

- `start_plain`: a `/bin/sh` moves itself into the sandbox's cgroups and execs bwrap, which runs the agent;
  the agent says READY on bwrap's stdout. Without the zygote (not root, or `zygote: false`).
- `start_with_zygote`: the same shell and bwrap, but bwrap's init blocks on a pipe that is never written
  instead of running the agent, and the agent zygote forks the agent into the sandbox once bwrap has made
  its namespaces. Root's default, where no spare is ready.
- `start_from_spare`: bwrap is exec'd by a spare's shell, which is in the sandbox's cgroups already, and
  the agent is forked by the zygote's child parked there (spares.py).

Each puts on the create's ExitStack (`held`) every descriptor it leaves the create (bwrap's info pipe, the
user namespace's pipe, the zygote's entry and the agent's READY pipe): the stack closes whatever the
create still holds when it ends, however it ends, and what the create hands on it takes from its holder
(`Fd.take`). Descriptors that only bwrap and the agent need go on `handover`, closed once they have them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local.bwrap import (AGENT_USER, INIT_USER, REMAP_BASE, SANDBOX_USER, SERVICE_USER,
                                                  SandboxPaths, bwrap_args, id_map)
from orchard.sandbox.backends.local.cgroups import CgroupSet
from orchard.sandbox.backends.local.gateway import agent_gateway_args
from orchard.sandbox.backends.local.launch import (launch_argv, launch_command, limit_lines, release_userns, spawn,
                                                   wait_ready_line, writable_subdirs)
from orchard.sandbox.backends.local.procs import Fd, fds_named_in, never_readable_fd
from orchard.sandbox.backends.local.spares import Spare
from orchard.sandbox.backends.local.zygote import Zygote, ZygoteEntry, begin_entry, read_ready
from orchard.sandbox.bundle import AgentBundle


@dataclass
class Plan:
    """What a create has settled before anything of its sandbox exists."""

    sandbox_id: str
    spec: SandboxSpec  # with its image's environment
    token: str
    rootfs: Path | None  # None: image `host`
    paths: SandboxPaths
    bwrap: str
    bundle: AgentBundle
    env: dict[str, str]  # the agent's own environment: nothing of the spec's or the image's
    commands_env: bytes  # the workload's, encoded (bwrap.encode_workload_env)
    gateway_socket: Path | None
    harness_bundles: list[tuple[str, Path]]
    hidden: list[Path]  # Orchard's own directories, covered in the sandbox
    remap: bool  # run by root: the sandbox's ids are mapped, and its root owns its writable layer
    read_only: list[Path]  # host directories locked read-only in the sandbox (launch.LOCK_SCRIPT)

    @property
    def owner(self) -> str:
        """Who owns the writable layer's directories (uid:gid on the host; "" for whoever makes them)."""
        return f"{REMAP_BASE}:{REMAP_BASE}" if self.remap else ""

    def bwrap_args(self, info_fd: int, token_fd: int, block_fd: int | None, env_fd: int,
                   hold_fd: int | None) -> list[str]:
        """bwrap's arguments, with the numbers its descriptors have in bwrap; `hold_fd`: the pipe its init
        blocks on instead of running the agent (the zygote's paths)."""
        return bwrap_args(self.spec, self.rootfs, self.paths, self.bundle.path, self.sandbox_id[:63], self.env,
                          info_fd, token_fd, hidden=self.hidden, userns_block_fd=block_fd,
                          gateway_socket=self.gateway_socket, harness_bundles=self.harness_bundles,
                          hold_fd=hold_fd, env_fd=env_fd)

    def launch_argv(self, args_fd: int, agent_argv: list[str], cg: CgroupSet | None) -> list[str]:
        return launch_argv(self.bwrap, args_fd, agent_argv, self.spec, self.rootfs, self.paths, cg, self.owner,
                           self.read_only)


@dataclass
class Started:
    """A sandbox on its way up: bwrap and what the create still reads of it and of its agent."""

    proc: subprocess.Popen  # the shell, bwrap's monitor once it has exec'd
    info: Fd  # bwrap's --info-fd: its init's pid, once the namespaces are made
    userns: Fd | None  # what bwrap waits on until its user namespace's id maps are written (root)
    entry: ZygoteEntry | None = None  # the zygote's paths: the agent on its way
    ready: Fd | None = None  # the zygote's paths: where the agent's READY line comes

    def namespaces_made(self, init_pid: int) -> None:
        """bwrap's init is `init_pid` (0: bwrap reported none and exits, saying why): the zygote's child may
        join it, and bwrap, waiting, gets its user namespace's id maps."""
        if self.entry is not None:
            self.entry.provide(init_pid)
        if self.userns is not None:
            if init_pid:
                release_userns(init_pid, self.userns.take(), id_map())
            else:
                self.userns.close()

    async def agent_ready(self, timeout: float, agent_pid: Callable[[int], None]) -> None:
        """Until the agent says READY: forked by the zygote (its pid, given to `agent_pid` first), else
        started by bwrap, on whose stdout it says so."""
        if self.entry is None or self.ready is None:
            await wait_ready_line(self.proc, timeout)
            return
        pid = await self.entry.agent_pid(timeout)
        self.entry.close()
        agent_pid(pid)
        await read_ready(self.ready.take(), timeout)


def outermost(paths: list[Path]) -> list[Path]:
    """`paths` without those inside another of them (binding that one read-only covers them)."""
    paths = sorted({p.resolve() for p in paths})
    return [p for p in paths if not any(other in p.parents for other in paths)]


def bind_agent_socket(paths: SandboxPaths, handover: contextlib.ExitStack) -> socket.socket:
    """The agent's socket, bound and listening in the run dir, where only the host can reach: the sandbox
    gets the open listening socket, never a directory it could fill or a path it could swap."""
    listener = handover.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    listener.bind(str(paths.socket))
    listener.listen(128)
    return listener


def make_writable_layer(plan: Plan) -> None:
    """The writable layer's directory; its subdirectories too, unless `disk_mb` puts them on a tmpfs made
    inside the sandbox's mount namespace. With `spec.services`, the services' state directory, owned by
    their user (outside `disk_mb`: the task's services, not the workload, write there)."""
    if plan.spec.services:
        plan.paths.services_dir.mkdir(mode=0o700)
        service_uid, service_gid = (int(n) for n in SERVICE_USER.split(":"))
        os.chown(plan.paths.services_dir, REMAP_BASE + service_uid, REMAP_BASE + service_gid)
    plan.paths.writable_dir.mkdir()
    if plan.spec.disk_mb:
        return
    plain, sticky = writable_subdirs(plan.rootfs)
    for sub in plain + sticky:
        (plan.paths.writable_dir / sub).mkdir()
        if sub in sticky:
            os.chmod(plan.paths.writable_dir / sub, 0o1777)
        if plan.remap:  # the sandbox's root owns its writable layer
            os.chown(plan.paths.writable_dir / sub, REMAP_BASE, REMAP_BASE)


def agent_command(plan: Plan, listener: socket.socket, cg: CgroupSet | None, agent_apart: bool,
                  handover: contextlib.ExitStack) -> tuple[list[str], tuple[int, ...]]:
    """The agent's command line, and the descriptors it names beside its socket: the workload cgroups'
    `cgroup.procs`, opened here as host root, through which the agent puts its commands' spawner there."""
    argv = plan.bundle.launch_argv(listen=f"fd:{listener.fileno()}", workdir=plan.spec.workdir)
    if plan.remap:
        argv += ["--user", SANDBOX_USER, "--init-user", INIT_USER]
        if agent_apart:
            argv += ["--agent-user", AGENT_USER, "--service-user", SERVICE_USER]
    argv += agent_gateway_args(plan.gateway_socket)
    workload_fds = tuple(handover.enter_context(Fd(os.open(procs, os.O_WRONLY | os.O_CLOEXEC))).fd
                         for procs in (cg.workload_procs_files if cg else []))
    if workload_fds:
        argv += ["--workload-cgroup-fds", ",".join(map(str, workload_fds))]
    return argv, workload_fds


def start_plain(plan: Plan, cg: CgroupSet | None, agent_argv: list[str], listener: socket.socket,
                workload_fds: tuple[int, ...], held: contextlib.ExitStack) -> Started:
    """bwrap runs the agent, handing it its socket and the workload's descriptors at their numbers."""
    proc, info_r, userns_w = spawn(
        lambda args_fd: plan.launch_argv(args_fd, agent_argv, cg),
        lambda info_fd, token_fd, block_fd, env_fd: plan.bwrap_args(info_fd, token_fd, block_fd, env_fd, None),
        plan.paths, plan.token, listener.fileno(), plan.commands_env, block_userns=plan.remap, keep_fds=workload_fds)
    return _started(proc, info_r, userns_w, held)


def start_with_zygote(plan: Plan, cg: CgroupSet | None, agent_argv: list[str], workload_fds: tuple[int, ...],
                      zygote: Zygote, held: contextlib.ExitStack, handover: contextlib.ExitStack) -> Started:
    """bwrap's init blocks on a pipe (never written: it holds a write end of its own) where the agent's
    socket would be, and the zygote gets the agent's descriptors instead; its child forks and joins the
    cgroups while bwrap makes the namespaces."""
    hold = handover.enter_context(Fd(never_readable_fd())).fd
    proc, info_r, userns_w = spawn(
        lambda args_fd: plan.launch_argv(args_fd, agent_argv, cg),
        lambda info_fd, token_fd, block_fd, env_fd: plan.bwrap_args(info_fd, token_fd, block_fd, env_fd, hold),
        plan.paths, plan.token, hold, plan.commands_env, block_userns=plan.remap, keep_fds=workload_fds)
    started = _started(proc, info_r, userns_w, held)
    _enter_agent(started, zygote, plan, cg, agent_argv, hold, held)
    return started


def start_from_spare(plan: Plan, cg: CgroupSet, agent_argv: list[str], spare: Spare,
                     held: contextlib.ExitStack) -> Started:
    """The spare's shell, in the cgroups already (renamed to the sandbox's), execs bwrap with the
    descriptors it was given when it was made; the zygote's child parked in them gets the request."""
    proc, info_r, userns_w = spare.launch(
        plan.bwrap_args(spare.info_number, spare.token_fd, spare.block_number, spare.env_fd, spare.hold_number),
        launch_command(plan.bwrap, spare.args_fd, agent_argv, plan.spec, plan.rootfs, plan.paths, plan.owner,
                       plan.read_only),
        limit_lines(plan.spec, cg), plan.paths.log_file, plan.token, plan.commands_env)
    started = _started(proc, info_r, userns_w, held)
    _enter_agent(started, spare.zygote, plan, cg, agent_argv, spare.hold_number, held, parked=spare.parked)
    spare.parked.close()
    return started


def _started(proc: subprocess.Popen, info_r: int, userns_w: int | None, held: contextlib.ExitStack) -> Started:
    return Started(proc, held.enter_context(Fd(info_r)),
                   held.enter_context(Fd(userns_w)) if userns_w is not None else None)


def _enter_agent(started: Started, zygote: Zygote, plan: Plan, cg: CgroupSet | None, agent_argv: list[str],
                 hold_number: int, held: contextlib.ExitStack, parked: socket.socket | None = None) -> None:
    """Send the zygote (or its child `parked` in the cgroups) the request for this sandbox's agent, with
    copies of the descriptors the agent's arguments name, at the numbers they name."""
    with contextlib.ExitStack() as copies:  # ours: the zygote has its own once the request is sent
        agent_fds = [(number, copies.enter_context(Fd(os.dup(number))).fd) for number in fds_named_in(agent_argv)]
        entry, ready_r = begin_entry(zygote, plan.spec, plan.rootfs, plan.env, cg, agent_argv, hold_number,
                                     agent_fds, plan.paths, plan.bundle, parked=parked)
        held.callback(entry.close)
        started.entry, started.ready = entry, held.enter_context(Fd(ready_r))
