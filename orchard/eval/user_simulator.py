"""A task's simulated user, as the evaluator runs it (docs/claw.md, "Multi-turn tasks"): a service of the task
that plays the user (`TaskService.user_model`, the Claw world's `user` service) answers the agent with the run's
`--user-model`, reached through the run's gateway under a rollout key of its own (`<rollout key>.user`), so its
calls are recorded apart from the agent's: they come back in the trajectory's `extra["user_simulator"]`, never
among the agent's `llm_calls`. Without `--user-model` the service follows its script (tests, the oracle); a
task whose user has no script is refused before any sandbox starts.

A user model call that failed is the simulator's failure, not the agent's: the rollout is a `model_error`."""

from __future__ import annotations

from typing import Any

from orchard.core.errors import InvalidRequest
from orchard.core.task import Task, TaskService
from orchard.core.trajectory import LLMCall
from orchard.eval.local_gateway import LocalGateway

USER_ROLLOUT_SUFFIX = ".user"
EXTRA_KEY = "user_simulator"
URL_ENV, KEY_ENV, MODEL_ENV = "ORCHARD_USER_MODEL_URL", "ORCHARD_USER_MODEL_KEY", "ORCHARD_USER_MODEL"


def user_rollout_key(rollout_key: str) -> str:
    return rollout_key + USER_ROLLOUT_SUFFIX


def user_services(task: Task) -> list[TaskService]:
    return [service for service in task.environment.all_services if service.user_model]


def uses_user_model(tasks: list[Task], user_model: str | None) -> bool:
    """Whether the run's sandboxes must reach its gateway for a user model."""
    return bool(user_model) and any(user_services(task) for task in tasks)


def check_user_model(tasks: list[Task], user_model: str | None) -> None:
    """Refuse a run without --user-model whose tasks have a user that only a model can play."""
    if user_model:
        return
    needing = [task.id for task in tasks if any(s.user_model == "required" for s in user_services(task))]
    if needing:
        shown = ", ".join(needing[:5]) + (f" and {len(needing) - 5} more" if len(needing) > 5 else "")
        raise InvalidRequest(f"task(s) {shown} talk with a simulated user that has no script: give the model "
                             "that plays it with --user-model NAME (any model the run's gateway serves)")


def with_user_model(task: Task, gateway: LocalGateway, rollout_key: str, user_model: str) -> Task:
    """`task` with its user services handed the user model: base URL and key of the user rollout, as a sandbox
    with the gateway on reaches them."""
    key = user_rollout_key(rollout_key)
    env = {URL_ENV: gateway.rollout_base_url(key, inside=True), KEY_ENV: gateway.rollout_api_key(key),
           MODEL_ENV: user_model}
    services = [service.model_copy(update={"env": {**service.env, **env}}) if service.user_model else service
                for service in task.environment.services]
    environment = task.environment.model_copy(update={"services": services})
    return task.model_copy(update={"environment": environment})


def failed_user_call(calls: list[LLMCall]) -> LLMCall | None:
    return next((call for call in reversed(calls) if call.error), None)


def user_record(user_model: str | None, calls: list[LLMCall]) -> dict[str, Any]:
    """What the trajectory keeps of its simulated user: who played it and every call it made."""
    return {"model": user_model or "script", "llm_calls": [call.model_dump(mode="json") for call in calls]}
