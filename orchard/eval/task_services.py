"""A task's services in a trial (docs/services.md): started after the task's setup, all at once, and waited
for (their port, then their health check) before the agent starts; checked again once the agent stops; their
logs kept with the trial. A service that does not start, never gets ready or dies is the environment's
failure (`ServiceFailed`, an `environment_error` naming it with its log's tail), never the agent's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

from orchard.core.deadline import Deadline
from orchard.core.errors import InvalidRequest, OrchardError, PortClosed
from orchard.core.sandbox import Sandbox, ServiceStart, ServiceStatus
from orchard.core.task import Task, TaskService
from orchard.harnesses.mcp.install import mcp_env

LOG_TAIL_CHARS = 1500
SERVICES_DIR = "services"  # OUT/services/<rollout key>/<name>.log
SERVICE_LOGS = "service_logs"  # Trajectory.extra: name -> its log's path, relative to OUT
POLL_S = 0.005


class ServiceFailed(InvalidRequest):
    """A task service did not start, never got ready, or died: the task's environment is broken."""


def service_env(task: Task) -> dict[str, str]:
    """What the sandbox's commands (and a services grader) are told of each service: its URL; and of the
    task's MCP servers, their client config (docs/tools-mcp.md)."""
    env = {f"{s.env_prefix}_URL": f"http://127.0.0.1:{s.port}" for s in task.environment.all_services if s.port}
    return {**env, **mcp_env(task)}


async def start_services(sandbox: Sandbox, task: Task) -> None:
    """Start every service of the task at once and wait until each is ready; ServiceFailed otherwise."""
    services = task.environment.all_services
    if not services:
        return
    # A port something else holds would pass for the service's own readiness: refused before they start.
    taken = set(await sandbox.listening_ports())
    for service in services:
        if service.port in taken:
            raise ServiceFailed(f"task {task.id}: port {service.port} of service {service.name} is already taken in "
                                "the sandbox before the services start (by the image or the task's setup)")
    await asyncio.gather(*(sandbox.start_service(ServiceStart(name=s.name, command=s.command, env=s.env,
                                                              seed_dir=s.seed_dir)) for s in services))
    await _until_ready(sandbox, task, services)


async def check_services(sandbox: Sandbox, task: Task) -> None:
    """ServiceFailed naming the first service of the task that is no longer running."""
    if not task.environment.all_services:
        return
    for status in await sandbox.services():
        if not status.running:
            raise ServiceFailed(f"task {task.id}: service {status.name} ended during the run ({_ending(status)})"
                                f"{_tail(status)}")


async def keep_service_logs(sandbox: Sandbox, task: Task, out_dir: Path | None, rollout_key: str) -> dict[str, str]:
    """Each service's log, written to OUT/services/<rollout key>/<name>.log; name -> path relative to OUT."""
    if not task.environment.all_services or out_dir is None:
        return {}
    try:
        statuses = await sandbox.services()
    except OrchardError:
        return {}  # the sandbox is gone: the trial's own error says why
    destination = out_dir / SERVICES_DIR / quote(rollout_key, safe="")
    destination.mkdir(parents=True, exist_ok=True)
    kept = {}
    for status in statuses:
        path = destination / f"{status.name}.log"
        dropped = f"[the first {status.log_dropped_bytes} bytes were not kept]\n" if status.log_dropped_bytes else ""
        path.write_text(dropped + status.log)
        kept[status.name] = str(path.relative_to(out_dir))
    return kept


async def _until_ready(sandbox: Sandbox, task: Task, services: list[TaskService]) -> None:
    """One poll for all of them (each poll asks the agent twice: the services compete with it for the CPU
    while they start), each service's health check made once its port listens."""
    deadlines = {s.name: Deadline.after(s.ready_timeout_s) for s in services}
    pending = {s.name: s for s in services}
    while pending:
        statuses = {status.name: status for status in await sandbox.services()}
        listening = set(await sandbox.listening_ports()) if any(s.port for s in pending.values()) else set()
        checks = {name: _not_ready(sandbox, service, listening) for name, service in pending.items()}
        why_not = dict(zip(checks, await asyncio.gather(*checks.values())))
        for name, service in list(pending.items()):
            status = statuses[name]
            if not status.running:
                raise ServiceFailed(f"task {task.id}: service {name} ended before it was ready "
                                    f"({_ending(status)}){_tail(status)}")
            if why_not[name] is None:
                del pending[name]
            elif deadlines[name].expired:
                raise ServiceFailed(f"task {task.id}: service {name} was not ready within "
                                    f"{service.ready_timeout_s:g} s ({why_not[name]}){_tail(status)}")
        if pending:
            await asyncio.sleep(POLL_S)


async def _not_ready(sandbox: Sandbox, service: TaskService, listening: set[int]) -> str | None:
    """None when ready, else why not yet."""
    if service.port is None:
        return None
    if service.port not in listening:
        return f"nothing listens on port {service.port}"
    if service.health_check is None:
        return None
    try:
        reader, writer = await sandbox.open_port(service.port)
    except PortClosed as exc:
        return str(exc)
    try:
        writer.write(f"GET {service.health_check} HTTP/1.0\r\nHost: 127.0.0.1:{service.port}\r\n\r\n".encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=10)
    except (OSError, TimeoutError) as exc:
        return f"GET {service.health_check} failed: {exc or type(exc).__name__}"
    finally:
        writer.close()
    parts = status_line.split()
    if len(parts) >= 2 and parts[1][:1] == b"2":
        return None
    return f"GET {service.health_check} answered {status_line.decode('latin-1').strip()[:80]!r}"


def _ending(status: ServiceStatus) -> str:
    return f"exit status {status.exit_code}" if status.exit_code is not None else "ended"


def _tail(status: ServiceStatus) -> str:
    log = status.log.strip()
    return f"; its log ends: {log[-LOG_TAIL_CHARS:]}" if log else "; its log is empty"
