"""The services grader (`ServicesGrader`): a check run after the agent stops, as the task services' own
user, where their state and ports are (docs/services.md). Its verdict comes from its exit status or the
last line it prints, never from a file: the agent could have written any file the check might read.

A grader that reads what the agent said (`final_text`) gets its final answer (final_text.py) as
$ORCHARD_FINAL_TEXT; one with a rubric `judge` has the judge's score added through the run's gateway
(rubric_judge.py) — without a gateway (`orchard eval validate`) its deterministic part is the reward, and
the details say the judge did not run."""

from __future__ import annotations

from orchard.core.errors import GraderError, InvalidRequest
from orchard.core.sandbox import Sandbox
from orchard.core.task import ServicesGrader, Task
from orchard.core.trajectory import Outcome
from orchard.eval.rubric_judge import judged, parts_of
from orchard.eval.task_services import service_env
from orchard.worlds.claw.eval_grade import FINAL_TEXT_ENV

OUTPUT_TAIL_CHARS = 2000


async def grade_services(sandbox: Sandbox, task: Task, *, pass_threshold: float = 1.0, final_text: str = "",
                         gateway=None, rollout_key: str | None = None) -> Outcome:
    """`final_text`: the agent's final answer; `gateway`: the run's (a LocalGateway: base_url, api_key), which
    the rubric judge is called through under `rollout_key` + `:judge`."""
    grader = task.grader
    if not isinstance(grader, ServicesGrader):
        raise InvalidRequest(f"task {task.id} has no services grader")
    env = service_env(task)
    if grader.final_text:
        env[FINAL_TEXT_ENV] = final_text
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
    if grader.judge is not None:
        if gateway is None:
            details["judge"] = (f"not run: no gateway here (orchard eval validate); the reward is the "
                                f"deterministic part only, without {grader.judge.model}'s rubric score")
        else:
            parts = await judged(grader.judge, instruction=task.instruction, answer=final_text,
                                 parts=parts_of(result.stdout), base_url=gateway.base_url, api_key=gateway.api_key,
                                 rollout_key=rollout_key)
            details["claw_score"], reward = parts, parts["score"]
            if rollout_key and hasattr(gateway, "end_rollout"):  # the judge's call is kept with the outcome
                calls = gateway.end_rollout(f"{rollout_key}:judge") or []
                kept = {"id", "model", "latency_s", "error", "response"}
                details["judge_calls"] = [call.model_dump(mode="json", include=kept) for call in calls]
    return Outcome(resolved=reward >= pass_threshold, reward=reward, details=details)
