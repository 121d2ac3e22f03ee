"""The services grader (`ServicesGrader`): a check run after the agent stops, as the task services' own
user, where their state and ports are (docs/services.md). Its verdict comes from its exit status or the
last line it prints, never from a file: the agent could have written any file the check might read."""

from __future__ import annotations

from orchard.core.errors import GraderError, InvalidRequest
from orchard.core.sandbox import Sandbox
from orchard.core.task import ServicesGrader, Task
from orchard.core.trajectory import Outcome
from orchard.eval.task_services import service_env

OUTPUT_TAIL_CHARS = 2000


async def grade_services(sandbox: Sandbox, task: Task, *, pass_threshold: float = 1.0) -> Outcome:
    grader = task.grader
    if not isinstance(grader, ServicesGrader):
        raise InvalidRequest(f"task {task.id} has no services grader")
    env = service_env(task)
    env.update({f"{s.env_prefix}_STATE": f"{status.state_dir}" for s in task.environment.all_services
                for status in await sandbox.services() if status.name == s.name})
    result = await sandbox.exec_as_service(grader.script, env=env, timeout=grader.timeout_s)
    if result.exit_code in (126, 127):
        raise GraderError(f"task {task.id}: the services check could not be started (exit {result.exit_code}): "
                          f"{result.output.strip()[-300:]}")
    details = {"grader": "services", "exit_code": result.exit_code, "timed_out": result.timed_out,
               "output_tail": result.output[-OUTPUT_TAIL_CHARS:], "pass_threshold": pass_threshold}
    if grader.reward == "exit_code":
        resolved = result.exit_code == 0 and not result.timed_out
        return Outcome(resolved=resolved, reward=1.0 if resolved else 0.0, details=details)
    if result.timed_out or result.exit_code != 0:
        raise GraderError(f"task {task.id}: the services check ended with exit status {result.exit_code}"
                          f"{' (timed out)' if result.timed_out else ''} instead of printing a reward; its "
                          f"output ends: {result.output.strip()[-300:]}")
    lines = result.stdout.strip().splitlines()
    try:
        reward = float(lines[-1]) if lines else float("nan")
    except ValueError:
        reward = float("nan")
    if not 0.0 <= reward <= 1.0:  # NaN included
        raise GraderError(f"task {task.id}: the services check's last line is not a reward in [0, 1]: "
                          f"{(lines[-1] if lines else '')[:80]!r}")
    return Outcome(resolved=reward >= pass_threshold, reward=reward, details=details)
