"""A task's services in a trial (docs/services.md): started after the task's setup, all at once, and waited
for (their port, then their health check) before the agent starts; checked again once the agent stops; their
logs kept with the trial. A service that does not start, never gets ready or dies is the environment's
failure (`ServiceFailed`, an `environment_error` naming it with its log's tail), never the agent's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

from orchard.core.deadline import Deadline
from orchard.core.errors import InvalidRequest, OrchardError
from orchard.core.sandbox import Sandbox, ServiceStart, ServiceStatus
from orchard.core.task import Task, TaskService
from orchard.harnesses.mcp.install import mcp_env

LOG_TAIL_CHARS = 1500
SERVICES_DIR = "services"  # OUT/services/<rollout key>/<name>.log
SERVICE_LOGS = "service_logs"  # Trajectory.extra: name -> its log's path, relative to OUT


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
                                                              seed_dir=s.seed_dir, port=s.port,
                                                              health_check=s.health_check)) for s in services))
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
    """The agent waits inside the sandbox (its port, then its health check, for each); asked again only
    for a service whose own ready timeout has not passed yet."""
    deadlines = {s.name: Deadline.after(s.ready_timeout_s) for s in services}
    pending = {s.name: s for s in services}
    while pending:
        wait = max(min(deadlines[name].time_left_s() for name in pending), 0.001)
        for status in await sandbox.wait_services(list(pending), timeout=wait):
            service = pending[status.name]
            if not status.running:
                raise ServiceFailed(f"task {task.id}: service {status.name} ended before it was ready "
                                    f"({_ending(status)}){_tail(status)}")
            if status.ready:
                del pending[status.name]
            elif deadlines[status.name].expired:
                raise ServiceFailed(f"task {task.id}: service {status.name} was not ready within "
                                    f"{service.ready_timeout_s:g} s ({status.not_ready or 'not checked yet'})"
                                    f"{_tail(status)}")


def _ending(status: ServiceStatus) -> str:
    return f"exit status {status.exit_code}" if status.exit_code is not None else "ended"


def _tail(status: ServiceStatus) -> str:
    log = status.log.strip()
    return f"; its log ends: {log[-LOG_TAIL_CHARS:]}" if log else "; its log is empty"
