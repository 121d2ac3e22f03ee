"""A task's sandbox, as the evaluator makes it for the agent and again for the grader: created from the
task's environment, its files placed, its setup commands run. Also the CPU time spent inside (the agent's
patch is `orchard.eval.patch`)."""

from __future__ import annotations

import os
import posixpath
import sys
from typing import Any

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import Sandbox, SandboxFactory
from orchard.core.task import Task
from orchard.eval.task_services import service_env, start_services
from orchard.harnesses.mcp.install import place_mcp_files

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_env(task: Task) -> dict[str, str]:
    """The task's environment variables; in the `host` image Orchard's own Python (which has pytest) comes
    first on PATH, so `python -m pytest` works for agents and graders alike. Its pytest plugins
    (pytest-asyncio, pytest-timeout, ...) are Orchard's test tooling, not the task's: they are not loaded, so
    a task's tests run under plain pytest (and each run starts ~0.2 s of CPU sooner)."""
    env = {**service_env(task), **task.environment.env}
    if task.environment.image == "host":
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", DEFAULT_PATH)
        env.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return env


async def create_task_sandbox(orch: SandboxFactory, task: Task, *, labels: dict[str, str] | None = None,
                              **spec_overrides: Any) -> Sandbox:
    """A ready sandbox for `task`: files placed, setup done, services ready. On any failure the sandbox is
    deleted; a setup command that fails is an InvalidRequest naming it, a service that does not get ready a
    ServiceFailed (the task's environment is broken)."""
    spec = task.environment.sandbox_spec(env=sandbox_env(task), labels=dict(labels or {}), **spec_overrides)
    sandbox = await orch.create(spec)
    try:
        await place_files(sandbox, task)
        await run_setup(sandbox, task)
        await place_mcp_files(sandbox, task)
        await start_services(sandbox, task)
    except BaseException:
        await sandbox.close()
        raise
    return sandbox


async def place_files(sandbox: Sandbox, task: Task) -> None:
    workdir = task.environment.workdir
    for file in task.environment.files:
        path = file.path if posixpath.isabs(file.path) else posixpath.join(workdir, file.path)
        await sandbox.write_file(path, file.data(), mode=file.mode)


async def run_setup(sandbox: Sandbox, task: Task) -> None:
    environment = task.environment
    for command in environment.setup:
        result = await sandbox.exec(command, cwd=environment.workdir, timeout=environment.setup_timeout_s)
        if result.timed_out:
            raise InvalidRequest(f"task {task.id}: setup command `{command}` ran past its "
                                 f"{environment.setup_timeout_s:g} s timeout; fix the task's setup or raise "
                                 "setup_timeout_s")
        if result.exit_code != 0:
            raise InvalidRequest(f"task {task.id}: setup command `{command}` failed with exit code "
                                 f"{result.exit_code}: {result.output.strip()[-800:]}")


async def sandbox_cpu_seconds(sandbox: Sandbox) -> float | None:
    """CPU seconds used so far by every process of the sandbox, the agent included (see
    `Sandbox.cpu_seconds`); None when the sandbox cannot tell."""
    return await sandbox.cpu_seconds()
