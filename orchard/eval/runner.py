"""`run_eval`: run a harness with a model over a suite's tasks, grade every rollout, record everything.

Per task (at most `parallel` agents at once, and as many gradings): a sandbox from the task's environment
(files placed, setup run) → the harness, its model calls going through the run's own gateway under the
rollout key `<run_id>:<task_id>:<attempt>` → the agent's patch (`git add -A && git diff --cached --binary`)
→ the sandbox deleted → graded in a fresh sandbox (SWE tests; a script grader runs in the agent's sandbox
before it is deleted) → the gateway's records of the rollout attached → one line appended to
trajectories.jsonl and results.json rewritten (see `orchard.eval.results`).

A rollout whose model or sandbox failed is recorded as an error (not a failed attempt). Re-running into the
same output directory resumes: finished tasks are skipped, errors are retried. Cancelling (Ctrl-C) stops the
run, deletes every sandbox and leaves only complete lines behind."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from pydantic import SecretStr

from orchard.core.errors import InvalidRequest, OrchardError
from orchard.core.harness import Harness, ModelConfig, SamplingParams, get_harness
from orchard.core.jsonl import write_jsonl
from orchard.core.task import ScriptGrader, SWETestsGrader, Task
from orchard.core.task_suite import TaskSuite
from orchard.core.trajectory import Agent, FinalMetrics, LLMCall, Outcome, Trajectory
from orchard.eval.grading import grade_script, grade_swe_patch
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.models import ORACLE_MODEL
from orchard.eval.results import (
    TRAJECTORIES_FILE,
    EvalResults,
    EvalSettings,
    TaskResult,
    build_results,
    latest_by_task,
    read_results,
    read_trajectories,
    utc_now,
    write_results,
)
from orchard.eval.suites import load_suite, select_tasks
from orchard.eval.task_sandbox import create_task_sandbox, extract_patch, sandbox_cpu_seconds
from orchard.gateway.config import GatewayConfig
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.client import AsyncOrchard

log = logging.getLogger(__name__)

DEFAULT_TASK_TIMEOUT_S = 1800.0
RUN_LABEL, TASK_LABEL = "orchard.eval/run", "orchard.eval/task"


class EvalListener(Protocol):
    """Told about progress (the CLI draws a progress bar with it)."""

    def run_started(self, results: EvalResults, to_run: list[str]) -> None: ...
    def task_finished(self, result: TaskResult) -> None: ...


def rollout_key(run_id: str, task_id: str, attempt: int) -> str:
    # The gateway's keys cannot hold '/', so the parts are joined by ':' and a task id is %-quoted.
    return f"{run_id}:{quote(task_id, safe='')}:{attempt}"


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


async def run_eval(*, harness: str, model: str, suite: str | Path | TaskSuite, out_dir: str | Path,
                   gateway_config: GatewayConfig, task_ids: list[str] | None = None, parallel: int = 4,
                   harness_options: dict[str, Any] | None = None, sampling: SamplingParams | None = None,
                   task_timeout_s: float = DEFAULT_TASK_TIMEOUT_S, orchard_url: str | None = None,
                   orchard_client: AsyncOrchard | None = None, listener: EvalListener | None = None) -> EvalResults:
    """Evaluate and return the results (also in `out_dir`). Everything a user can get wrong (unknown
    harness, suite or task, an output directory holding another run) is refused before anything is
    written. `gateway_config` says which models the run's gateway serves (see `orchard.eval.models`).
    Sandboxes come from `orchard_client` when given (it stays open), else from a client of its own:
    embedded, or the server at `orchard_url` / ORCHARD_URL."""
    if parallel < 1:
        raise InvalidRequest(f"parallel must be at least 1, got {parallel}")
    options = dict(harness_options or {})
    agent = get_harness(harness, **options)
    loaded = load_suite(suite)
    tasks = select_tasks(loaded, task_ids)
    out = Path(out_dir)
    settings = EvalSettings(harness=harness, harness_version=agent.version, model=model, suite=loaded.name,
                            suite_path=None if isinstance(suite, TaskSuite) else str(suite),
                            task_ids=[task.id for task in tasks], parallel=parallel, harness_options=options)
    previous = read_results(out)
    _check_same_run(previous, settings, out)
    run = _Run(agent, model, tasks, out, settings, previous, sampling or SamplingParams(), task_timeout_s,
               listener)
    return await run.execute(gateway_config, parallel, orchard_url, orchard_client)


def _check_same_run(previous: EvalResults | None, settings: EvalSettings, out: Path) -> None:
    if previous is None:
        return
    before = previous.settings
    if (before.harness, before.model, before.suite) != (settings.harness, settings.model, settings.suite):
        raise InvalidRequest(
            f"{out} holds a run of harness {before.harness!r} with model {before.model!r} on suite {before.suite!r}; "
            "resume it with the same harness, model and suite, or choose another --out")


@dataclass
class _Slots:
    agents: asyncio.Semaphore
    graders: asyncio.Semaphore


@dataclass
class _Rollout:
    trajectory: Trajectory
    patch: str | None  # the agent's diff, when it is to be graded in a fresh sandbox
    wall_s: float  # sandbox creation to the agent's sandbox deleted
    cpu_s: float | None


class _Run:
    def __init__(self, harness: Harness, model: str, tasks: list[Task], out: Path, settings: EvalSettings,
                 previous: EvalResults | None, sampling: SamplingParams, task_timeout_s: float,
                 listener: EvalListener | None) -> None:
        self.harness, self.model, self.tasks, self.out = harness, model, tasks, out
        self.sampling, self.task_timeout_s, self.listener = sampling, task_timeout_s, listener
        # A resumed run keeps its id (rollout keys stay unique) and start time; settings may grow tasks.
        self.run_id = previous.run_id if previous else new_run_id()
        self.started_at = previous.started_at if previous else utc_now()
        if previous is not None:
            settings.task_ids = list(dict.fromkeys(previous.settings.task_ids + settings.task_ids))
        self.settings = settings
        self.trajectories = read_trajectories(out)
        self.gateway: LocalGateway | None = None
        self.orch: AsyncOrchard | None = None

    def _to_run(self) -> list[tuple[Task, int]]:
        """Tasks without a finished rollout, each with its next attempt number."""
        latest = latest_by_task(self.trajectories)
        pending = []
        for task in self.tasks:
            trajectory, attempts = latest.get(task.id, (None, 0))
            if trajectory is None or trajectory.outcome is None or trajectory.outcome.error is not None:
                pending.append((task, attempts + 1))
        return pending

    def results(self, *, interrupted: bool = False) -> EvalResults:
        return build_results(self.run_id, self.settings, self.started_at, self.trajectories,
                             interrupted=interrupted)

    async def execute(self, gateway_config: GatewayConfig, parallel: int, orchard_url: str | None,
                      orchard_client: AsyncOrchard | None) -> EvalResults:
        pending = self._to_run()
        write_results(self.out, self.results())
        if self.listener is not None:
            self.listener.run_started(self.results(), [task.id for task, _ in pending])
        if not pending:
            return self.results()
        finished = False
        try:
            self.gateway = LocalGateway(gateway_config)
            await asyncio.to_thread(self.gateway.start)
            async with contextlib.AsyncExitStack() as stack:
                self.orch = orchard_client or await stack.enter_async_context(AsyncOrchard(orchard_url))
                # `parallel` agents at once, and up to `parallel` gradings beside them: a finished agent's
                # slot goes to the next task while its patch is graded, so model-bound runs keep the model busy.
                slots = _Slots(asyncio.Semaphore(parallel), asyncio.Semaphore(parallel))
                async with asyncio.TaskGroup() as group:
                    for task, attempt in pending:
                        group.create_task(self._bounded(slots, task, attempt))
            finished = True
        finally:
            if self.gateway is not None:
                await asyncio.to_thread(self.gateway.stop)
            write_results(self.out, self.results(interrupted=not finished))
        return self.results()

    async def _bounded(self, slots: _Slots, task: Task, attempt: int) -> None:
        key = rollout_key(self.run_id, task.id, attempt)
        async with slots.agents:
            rollout = await self._rollout(task, key)
        if rollout.patch is not None:
            async with slots.graders:
                rollout.trajectory.outcome = await self._grade(task, rollout.patch)
        self._record(self._finish(task, rollout, key), attempt)

    def _record(self, trajectory: Trajectory, attempt: int) -> None:
        # Synchronous from here on: a cancellation cannot cut a line or leave results.json behind the file.
        write_jsonl(self.out / TRAJECTORIES_FILE, [trajectory], append=True)
        self.trajectories.append(trajectory)
        write_results(self.out, self.results())
        if self.listener is not None:
            self.listener.task_finished(TaskResult.from_trajectory(trajectory, attempt))

    async def _rollout(self, task: Task, key: str) -> _Rollout:
        """The agent's run in its own sandbox, up to the patch it leaves (graded later, elsewhere)."""
        started = time.monotonic()
        trajectory, patch, cpu_s = None, None, None
        sandbox: AgentSandbox | None = None
        try:
            sandbox = await create_task_sandbox(self.orch, task, labels={RUN_LABEL: self.run_id,
                                                                          TASK_LABEL: _label_value(task.id)})
            cpu_before = await sandbox_cpu_seconds(sandbox)
            trajectory = await self._run_harness(task, sandbox, key)
            if not _errored(trajectory):
                if isinstance(task.grader, SWETestsGrader):
                    patch, trajectory.outcome = await _agent_patch(sandbox, task)
                elif isinstance(task.grader, ScriptGrader):
                    trajectory.outcome = await grade_script(sandbox, task)
            cpu_after = await sandbox_cpu_seconds(sandbox)
            if cpu_before is not None and cpu_after is not None:
                cpu_s = max(0.0, cpu_after - cpu_before)
        except OrchardError as exc:
            trajectory = self._failed(trajectory, f"sandbox: {exc.code}: {exc}")
        finally:
            if sandbox is not None:
                await _close_quietly(sandbox)
        return _Rollout(trajectory, patch, time.monotonic() - started, cpu_s)

    async def _run_harness(self, task: Task, sandbox: AgentSandbox, key: str) -> Trajectory:
        model = ModelConfig(model=self.model, base_url=self.gateway.base_url,
                            api_key=SecretStr(self.gateway.api_key), rollout_key=key, sampling=self.sampling)
        visible = task.model_copy(update={"grader": None})  # the tests and the gold patch stay with the grader
        oracle = _oracle_module() if self.model == ORACLE_MODEL else None
        if oracle is not None:
            oracle.register(key, task)
        deadline = asyncio.timeout(self.task_timeout_s)
        try:
            async with deadline:
                trajectory = await self.harness.run(visible, sandbox, model)
        except TimeoutError as exc:
            if not deadline.expired():  # the harness's own timeout escaped it: a crash like any other
                log.exception("harness %s crashed on task %s", self.harness.name, task.id)
                return self._failed(None, f"harness crashed: TimeoutError: {exc}")
            return self._failed(None, f"timeout: the harness ran past the task timeout of {self.task_timeout_s:g} s")
        except OrchardError as exc:
            return self._failed(None, f"{exc.code}: {exc}")
        except Exception as exc:  # a harness bug must not stop the run: the rollout is an error, logged
            log.exception("harness %s crashed on task %s", self.harness.name, task.id)
            return self._failed(None, f"harness crashed: {type(exc).__name__}: {exc}")
        finally:
            if oracle is not None:
                oracle.unregister(key)
        if not isinstance(trajectory, Trajectory):
            return self._failed(None, f"harness {self.harness.name!r} returned {type(trajectory).__name__}, "
                                      "not a Trajectory")
        return trajectory

    async def _grade(self, task: Task, patch: str) -> Outcome:
        try:
            outcome = await grade_swe_patch(self.orch, task, patch, labels={RUN_LABEL: self.run_id,
                                                                             TASK_LABEL: _label_value(task.id)})
        except OrchardError as exc:
            return Outcome(error=f"grading: {exc.code}: {exc}", details={"patch": patch})
        outcome.details["patch"] = patch
        return outcome

    def _failed(self, trajectory: Trajectory | None, error: str) -> Trajectory:
        if trajectory is None:
            trajectory = Trajectory(agent=Agent(name=self.harness.name, version=self.harness.version,
                                                model_name=self.model))
        trajectory.outcome = Outcome(error=error)
        return trajectory

    def _finish(self, task: Task, rollout: _Rollout, key: str) -> Trajectory:
        """The trajectory as recorded: the gateway's calls attached (steps pointing at them), the
        accounting from those calls, the task and key set."""
        calls = self.gateway.end_rollout(key)
        data = rollout.trajectory.model_dump()
        data["steps"] = _link_steps_to_calls(data["steps"], calls)
        data.update(task_id=task.id, rollout_key=key,
                    llm_calls=[call.model_dump() for call in calls])
        data["agent"]["model_name"] = data["agent"].get("model_name") or self.model
        data["final_metrics"] = FinalMetrics.from_llm_calls(
            calls, total_steps=len(data["steps"]), wall_time_s=rollout.wall_s, sandbox_cpu_s=rollout.cpu_s).model_dump()
        if data.get("outcome") is None:
            data["outcome"] = Outcome(error="not graded: the task has no grader").model_dump()
        return Trajectory.model_validate(data)


async def _agent_patch(sandbox: AgentSandbox, task: Task) -> tuple[str | None, Outcome | None]:
    """The agent's diff, or (None, a failed outcome) when it cannot be taken: the agent broke the
    repository (or made a diff too large to grade), which is its failed attempt, not an error."""
    try:
        return await extract_patch(sandbox, task.environment.workdir), None
    except InvalidRequest as exc:
        return None, Outcome(resolved=False, reward=0.0, details={"patch_error": str(exc)})


def _errored(trajectory: Trajectory) -> bool:
    return trajectory.outcome is not None and trajectory.outcome.error is not None


def _link_steps_to_calls(steps: list[dict[str, Any]], calls: list[LLMCall]) -> list[dict[str, Any]]:
    """Step `llm_call_ids` as the gateway's call ids. A harness only sees the response body, so it may
    have recorded the response's `id` (in `llm_call_ids`, or as `extra["response_id"]` of an agent step);
    that is mapped to the call that returned it. Ids that match no recorded call are dropped (logged): a
    trajectory must not point at calls it does not hold."""
    known = {call.id for call in calls}
    by_response_id = {str(call.response.get("id")): call.id for call in calls
                      if call.response is not None and call.response.get("id")}
    for step in steps:
        linked = []
        given = step.get("llm_call_ids") or []
        if not given and step.get("source") == "agent" and (step.get("extra") or {}).get("response_id"):
            given = [str(step["extra"]["response_id"])]
        for call_id in given:
            target = call_id if call_id in known else by_response_id.get(call_id)
            if target is None:
                log.warning("step %s points at model call %r, which the gateway did not record; dropped",
                            step.get("step_id"), call_id)
            elif target not in linked:
                linked.append(target)
        step["llm_call_ids"] = linked
    return steps


def _label_value(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:63]


def _oracle_module():
    from orchard.policies import oracle

    return oracle


async def _close_quietly(sandbox: AgentSandbox) -> None:
    try:
        await sandbox.close()
    except OrchardError as exc:  # the sandbox is gone either way; the AsyncOrchard close retries
        log.warning("deleting sandbox %s failed: %s", sandbox.id, exc)
