"""The local backend's side of the agent zygote (the agent's zygote.py): starting it, asking it for an agent
inside a sandbox, stopping it. One per LocalBackend, started at its first create, run by root only (it
needs setns into the sandbox's user namespace); see docs/local-backend.md#start-path."""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import threading
import time
from pathlib import Path

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.bundle import AGENT_PACKAGE, DEFAULT_MOUNT_POINT, AgentBundle, agent_launcher
import orchard.sandbox.backends.local.bwrap as bwrap_module
from orchard.sandbox.backends.local.bwrap import SandboxPaths
from orchard.sandbox.backends.local.config import ZYGOTE_ENV
from orchard.sandbox.backends.local.launch import HOST_ENV

# Capability numbers (linux/capability.h) of those bwrap may leave the agent (bwrap.py AGENT_SETUP_CAPS).
CAPABILITIES = {"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_SYS_ADMIN": 21}
START_TIMEOUT_S = 30.0
# Room in the zygote's environment area for a sandbox's environment, which each agent writes over it
# (zygote.py `_show_environment`): a variable of that many spaces.
ENV_AREA_NAME, ENV_AREA_BYTES = "ORCHARD_ZYGOTE_ENV_AREA", 32 << 10
ANSWER_TIMEOUT_S = 40.0  # the zygote's child waits up to 30 s for bwrap's mounts
PARK_TIMEOUT_S = 10.0


def zygote_wanted(remapped: bool, setting: bool | None) -> bool:
    """Whether sandboxes get their agent from the zygote: by default wherever it can run, i.e. as root,
    which maps the sandbox's ids and so gives the workload a pid namespace of its own, where it cannot see
    what holds the sandbox open; off when the `zygote` setting is false (else ORCHARD_LOCAL_ZYGOTE=0)."""
    if setting is None:
        setting = os.environ.get(ZYGOTE_ENV, "1").strip() != "0"
    return bool(setting) and remapped


class Zygote:
    """A started zygote: `enter` asks it for one agent, `close` stops it (agents it made keep running)."""

    def __init__(self, bundle: AgentBundle) -> None:
        """Starts it and waits until it has imported the agent. Its own errors go to our stderr (an
        agent's go to its sandbox's agent.log, failures to fork one to the create that asked). Refuses
        (BackendError) a bundle whose files are not those it was built with: the zygote runs them as
        root on the host, and sandboxes mount that same bundle."""
        bundle.verify_content()
        self.bundle = bundle
        self._lock = threading.Lock()  # one request at a time, whichever event loop or thread asks
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        root = str(bundle.path)
        argv = [*bundle.interpreter_argv(mount_point=root),
                "-c", agent_launcher(AGENT_PACKAGE, root, "zygote", f"serve({theirs.fileno()})")]
        try:
            # LC_ALL=C as the agents have it (bwrap.agent_env): nothing outside the bundle is loaded.
            self.process = subprocess.Popen(argv, env={**HOST_ENV, "LC_ALL": "C",
                                                       ENV_AREA_NAME: " " * ENV_AREA_BYTES},
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as e:
            ours.close()
            raise BackendError(f"could not start the agent zygote: {e}") from e
        finally:
            theirs.close()
        try:
            ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
            line = self.process.stdout.readline() if ready else b""
            if not line.startswith(b"READY"):
                raise BackendError("the agent zygote did not start (its errors are on this process's "
                                   f"stderr); set {ZYGOTE_ENV}=0 to start every agent on its own")
        except BaseException:
            self.close()
            raise
        self.process.stdout.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def park(self, cgroup_procs: list[str], timeout: float = PARK_TIMEOUT_S) -> socket.socket:
        """Have the zygote fork a child that joins these groups now (a spare's, spares.py) and waits
        for its request; returns the socket to send that request on (`begin(..., parked=)`); closing it
        unused ends the child. BackendError when the child could not join them or did not say so in time."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                socket.send_fds(self._socket, [json.dumps({"park": True, "cgroup_procs": cgroup_procs}).encode()],
                                [theirs.fileno()])
            ready, _, _ = select.select([ours], [], [], timeout)
            answer = ours.recv(1 << 16) if ready else b""
            if answer != b"parked":
                raise BackendError(f"the agent zygote's child did not join a spare's cgroups: "
                                   f"{answer.decode(errors='replace') or 'no answer'}")
        except BaseException as e:
            ours.close()
            if isinstance(e, OSError):
                raise BackendError(f"the agent zygote did not take a spare: {e}") from e
            raise
        finally:
            theirs.close()
        return ours

    def begin(self, request: dict, fds: list[int], parked: socket.socket | None = None) -> "ZygoteEntry":
        """Have the zygote fork the child that will start an agent (the module's `begin_entry`), or hand
        the request to a child `parked` in the sandbox's cgroups already; the child joins the sandbox's
        cgroups at once (unless parked there) and waits for `ZygoteEntry.provide` to name the sandbox's
        init. Raises BackendError (the zygote or the parked child stopped) when the request cannot be sent."""
        answer_ours, answer_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        init_r, init_w = os.pipe()
        try:
            if parked is not None:
                socket.send_fds(parked, [json.dumps(request).encode()], [answer_theirs.fileno(), init_r, *fds])
            else:
                with self._lock:  # one message at a time on the shared socket; answers come on answer_ours
                    socket.send_fds(self._socket, [json.dumps(request).encode()],
                                    [answer_theirs.fileno(), init_r, *fds])
        except OSError as e:
            answer_ours.close()
            os.close(init_w)
            if parked is None:
                self.close()
            raise BackendError(f"the agent zygote did not take the request: {e}") from e
        finally:
            answer_theirs.close()
            os.close(init_r)
        return ZygoteEntry(self, answer_ours, init_w)

    def close(self) -> None:
        """Stop the zygote: it exits when its socket closes; killed if it does not within 5 s."""
        self._socket.close()  # (again: harmless)
        deadline = time.monotonic() + 5.0
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()


class ZygoteEntry:
    """One agent on its way: `provide` the sandbox's init, then `agent_pid`; `close` in every case."""

    def __init__(self, zygote: Zygote, answer: socket.socket, init_w: int) -> None:
        self.zygote, self._answer, self._init_w = zygote, answer, init_w
        answer.setblocking(False)

    def provide(self, init_pid: int) -> None:
        """The pid of bwrap's init (0: bwrap reported none; the child then gives up)."""
        try:
            if init_pid:
                os.write(self._init_w, b"%d\n" % init_pid)
        except OSError:
            pass  # the child has gone: its answer says why
        finally:
            os.close(self._init_w)
            self._init_w = -1

    async def agent_pid(self, timeout: float) -> int:
        """The agent's pid (the host's view), once the child has forked it in the sandbox; BackendError
        saying why it could not, TimeoutError past `timeout` (the create's ready timeout). A zygote that
        does not answer within ANSWER_TIMEOUT_S is stopped (the next create starts a new one)."""
        loop = asyncio.get_running_loop()
        try:
            answer = await asyncio.wait_for(loop.sock_recv(self._answer, 1 << 16), min(timeout, ANSWER_TIMEOUT_S))
        except (TimeoutError, asyncio.TimeoutError):
            if timeout < ANSWER_TIMEOUT_S:
                raise TimeoutError from None
            await asyncio.to_thread(self.zygote.close)
            raise BackendError(f"the agent zygote did not answer within {ANSWER_TIMEOUT_S:g} s") from None
        if not answer:
            raise BackendError("the agent zygote's child exited without answering (its errors are on this "
                               "process's stderr)")
        message = json.loads(answer)
        if "agent_pid" not in message:
            raise BackendError(f"the agent zygote could not start the agent in the sandbox: "
                               f"{message.get('error', message)}")
        return int(message["agent_pid"])

    def close(self) -> None:
        if self._init_w >= 0:
            os.close(self._init_w)
            self._init_w = -1
        self._answer.close()


def begin_entry(zygote: Zygote, spec: SandboxSpec, rootfs: Path | None, env: dict[str, str], cg,
                agent_argv: list[str], hold_fd: int, agent_fds: list[tuple[int, int]], paths: SandboxPaths,
                bundle: AgentBundle, parked: socket.socket | None = None) -> tuple[ZygoteEntry, int]:
    """Send the zygote the request for this sandbox's agent as soon as bwrap runs (its child forks and
    joins the cgroups while bwrap makes the namespaces), or to the child `parked` in them already (a
    spare's); (the entry, the read end of the agent's READY pipe). The agent's descriptors keep the
    numbers its arguments name."""
    ready_r, ready_w = os.pipe()
    log_fd = os.open(paths.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        nproc = (spec.max_processes if spec.max_processes and (cg is None or "pids" not in cg.controllers)
                 else None)
        request = agent_request(
            block_fd=hold_fd, nproc=nproc,
            cgroup_procs=[str(f) for f in cg.procs_files] if cg is not None and parked is None else [], env=env,
            cwd=spec.workdir if rootfs is None else "/", argv=agent_argv[agent_argv.index("--listen"):],
            bundle=bundle)
        request["fds"] = [number for number, _ in agent_fds]
        entry = zygote.begin(request, [ready_w, log_fd, *(fd for _, fd in agent_fds)], parked)
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        os.close(ready_w)
        os.close(log_fd)
    return entry, ready_r


def agent_request(*, block_fd: int, cgroup_procs: list[str], nproc: int | None,
                  env: dict[str, str], cwd: str, argv: list[str], bundle: AgentBundle) -> dict:
    """What the zygote needs to start one agent (zygote.py `_enter`): `argv` is the agent's own arguments
    (after the interpreter's), with `--listen fd:3`."""
    caps = sum(1 << CAPABILITIES[name] for name in bwrap_module.AGENT_SETUP_CAPS)  # as bwrap's --cap-add
    return {"block_fd": block_fd, "cgroup_procs": cgroup_procs, "nproc": nproc,
            "env": env, "cwd": cwd, "argv": argv, "caps": caps, "bundle_host": str(bundle.path),
            "bundle_mounted": DEFAULT_MOUNT_POINT}


async def read_ready(fd: int, timeout: float) -> str:
    """The agent's READY line from the read end of its stdout pipe (closed here); raises TimeoutError, or
    BackendError when the pipe closed first."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    try:
        while True:
            line = (await asyncio.wait_for(reader.readline(), timeout)).decode(errors="replace")
            if not line:
                raise BackendError("the agent exited before it was ready")
            if line.startswith("READY"):
                return line.strip()
    finally:
        transport.close()
