"""A Trial: one attempt of one harness × model on one task, in phases, each timed and with its own limit
and outcome class:

    environment    a sandbox from the task's environment, files placed, setup run, services ready, the base
                   snapshot taken
    harness_setup  the harness's optional `setup(task, sandbox)`
    agent          `harness.run(...)`, told its deadline; cut off there (the steps so far are kept)
    patch          the agent's diff against the base snapshot (SWE tasks), or the script grader run in the
                   agent's sandbox (script tasks); then the sandbox is deleted
    verify         the patch graded in a fresh sandbox (SWE tasks)

Only the agent's own outcomes count as attempts (see `orchard.core.run_status`): a phase that fails for any
other reason ends the trial as an error with a typed `exit_status` (`environment_error`, `harness_error`,
`timeout`, `agent_error`, `model_error`, `sandbox_error`, `grader_error`), the steps so far kept. A trial
never raises, except when it is cancelled (the run was stopped).

A task's services (task_services.py) have their logs kept once the agent stops; one that died meanwhile
ends the trial as an `environment_error`.

For a harness that runs a program of its own in the sandbox (it names a harness bundle, in_sandbox.py): the
files it lists in `extra["native_logs"]` are copied out before the sandbox goes (native_logs.py); a class
that says `steps_from_gateway = True` gets its steps rebuilt from the gateway's records of its rollout
(partial.py; the zero-code `cli` harness), and when such a harness fails right after its last model call
failed, the rollout is a `model_error`; and a rollout that never called the model is an error.

The phases are one class so that they read top to bottom in the order they run, with the bookkeeping
they share (the deadline, the phase records, the checkpoint); that is why this file passes ~400 lines.
How each phase's failure is classed is trial_status.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

from pydantic import SecretStr, ValidationError

from orchard.core.deadline import Deadline
from orchard.core.errors import InvalidRequest, ModelError, OrchardError, exception_text, first_problem
from orchard.core.harness import Harness, ModelConfig, SamplingParams, setup_harness
from orchard.core.policy import RolloutHooks
from orchard.core.run_status import ExitStatus, PhaseName, PhaseRecord
from orchard.core.sandbox import Sandbox, SandboxFactory, StartupTimings
from orchard.core.task import ScriptGrader, ServicesGrader, SWETestsGrader, Task
from orchard.core.trajectory import Agent, FinalMetrics, LLMCall, Outcome, Trajectory
from orchard.eval.checkpoint import INTERRUPTED_PHASE, TrialCheckpoint, write_checkpoint
from orchard.eval.final_text import final_text
from orchard.eval.grading import grade_script, grade_swe_patch
from orchard.eval.in_sandbox import inside_model, sandbox_overrides
from orchard.eval.native_logs import keep_native_logs
from orchard.eval.service_grading import grade_services
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.partial import offered_tools, trajectory_from_calls
from orchard.eval.patch import extract_patch, snapshot_base
from orchard.eval.run_config import TrialTimeouts
from orchard.eval.step_links import link_steps_to_calls
from orchard.eval.suites import LOAD_ERROR_KEY
from orchard.eval.task_sandbox import create_task_sandbox, sandbox_cpu_seconds
from orchard.eval.task_services import SERVICE_LOGS, ServiceFailed, check_services, keep_service_logs
from orchard.eval.trajectory_images import keep_images
from orchard.eval.user_simulator import (EXTRA_KEY as USER_EXTRA, failed_user_call, user_record, user_rollout_key,
                                         user_services, with_user_model)
from orchard.eval.trial_status import (blame_a_failed_model_call, counts, environment_status, grader_status,
                                      harness_setup_status, patch_status, settle_exit_status)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# A trial's sandboxes live this long past the trial's deadline: their TTL never ends a trial early (a long
# --trial-timeout, RL's), and closing them fits in it. The grading sandbox's covers the verify phase.
SANDBOX_TTL_MARGIN_S = 600.0


@dataclass
class TrialRig:
    """What every trial of a run shares."""

    harness: Harness
    model: str
    sampling: SamplingParams
    timeouts: TrialTimeouts
    orch: SandboxFactory
    gateway: LocalGateway
    agent_slots: asyncio.Semaphore  # trials whose agent runs at once
    grading_slots: asyncio.Semaphore  # gradings beside them: a finished agent's slot goes to the next trial
    labels: dict[str, str] = field(default_factory=dict)
    bundle: str | None = None  # the harness runs inside the sandbox from this harness bundle (in_sandbox.py)
    out_dir: Path | None = None  # the run's directory: a harness's native logs are kept under it (native_logs.py)
    pass_threshold: float = 1.0  # a script grader's reward resolves the task from this on (grading.py)
    user_model: str | None = None  # plays the tasks' simulated users (user_simulator.py); None: their scripts


class PhaseFailed(Exception):
    """A phase ended the trial: as an error with `status`, or (status None) as the agent's failed attempt."""

    def __init__(self, status: ExitStatus | None, message: str) -> None:
        super().__init__(message)
        self.status = status


class Trial:
    def __init__(self, rig: TrialRig, task: Task, rollout_key: str, labels: dict[str, str]) -> None:
        self.rig, self.task, self.key, self.labels = rig, task, rollout_key, labels
        self.phases: list[PhaseRecord] = []
        self.started = time.monotonic()
        self.deadline = Deadline(self.started + rig.timeouts.trial_s)
        self.agent_wall_s = 0.0
        self.cpu_s: float | None = None
        self.sandbox_startup: StartupTimings | None = None  # the task sandbox's start, stage by stage
        self._open: set[str] = set()  # phases started and not yet ended
        self._kept: TrialCheckpoint | None = None  # the agent's result, checkpointed before grading
        self._earlier_calls: list[LLMCall] = []  # a checkpointed rollout's calls, made in an earlier session

    # --- the phases ----------------------------------------------------------------------------------

    async def run(self) -> Trajectory:
        """The graded trajectory, gateway records attached. Never raises but CancelledError."""
        async with self.rig.agent_slots:
            trajectory, patch = await self._up_to_patch()
        if patch is not None:
            self._keep_agent_result(trajectory, patch)
            await self._grade(trajectory, patch)
        return self._finish(trajectory)

    async def grade_checkpointed(self, checkpoint: TrialCheckpoint) -> Trajectory:
        """The trial of an earlier session whose agent had finished (`checkpoint.to_grade`), graded now: its
        patch in a fresh sandbox, the agent not run again. Never raises but CancelledError."""
        assert checkpoint.trajectory is not None and checkpoint.patch is not None
        self.phases = [phase for phase in checkpoint.phases if phase.name != "verify"]
        self.started = time.monotonic() - checkpoint.elapsed_s
        self.deadline = Deadline(self.started + self.rig.timeouts.trial_s)
        self.cpu_s, self.sandbox_startup = checkpoint.sandbox_cpu_s, checkpoint.sandbox_startup
        self._earlier_calls = list(checkpoint.llm_calls)
        self._kept = checkpoint
        trajectory = checkpoint.trajectory.model_copy(deep=True)
        await self._grade(trajectory, checkpoint.patch)
        return self._finish(trajectory)

    async def _grade(self, trajectory: Trajectory, patch: str) -> None:
        trajectory.outcome = await self._verify(patch)
        if trajectory.outcome.error is not None:
            trajectory.exit_status = "grader_error"

    def _keep_agent_result(self, trajectory: Trajectory, patch: str) -> None:
        """Checkpoint what the agent produced before grading it: a kill from here on costs a grading, not
        the agent's run (its model calls, and its sample)."""
        if self.rig.out_dir is None:
            return
        calls = self.rig.gateway.gateway.calls(self.key)
        try:  # the trajectory with its calls: steps built from the gateway's records name them
            self._kept = TrialCheckpoint(
                rollout_key=self.key, trajectory=trajectory.model_copy(update={"llm_calls": calls}), patch=patch,
                llm_calls=calls, elapsed_s=time.monotonic() - self.started, sandbox_cpu_s=self.cpu_s,
                sandbox_startup=self.sandbox_startup)
            self._save_phases()
        except (ValueError, OSError) as exc:  # no checkpoint costs a resume the agent's run, never this trial
            self._kept = None
            log.warning("could not checkpoint the agent's result of %s before grading (a resume would run the "
                        "agent again): %s", self.key, exception_text(exc))

    def _save_phases(self) -> None:
        """The phases so far on disk (the running one marked interrupted until it ends): what an interrupted
        rollout is recorded with after a kill."""
        if self.rig.out_dir is None:
            return
        phases = [phase if phase.name not in self._open else PhaseRecord(
            name=phase.name, result="error", started_at=phase.started_at, timeout_s=phase.timeout_s,
            error=INTERRUPTED_PHASE) for phase in self.phases]
        kept = self._kept or TrialCheckpoint(rollout_key=self.key)
        write_checkpoint(self.rig.out_dir, kept.model_copy(update={"phases": phases}))

    async def _up_to_patch(self) -> tuple[Trajectory, str | None]:
        """Every phase in the agent's sandbox; the trial's clock starts here (a slot was free)."""
        self.started = time.monotonic()
        self.deadline = Deadline(self.started + self.rig.timeouts.trial_s)
        trajectory: Trajectory | None = None
        patch: str | None = None
        sandbox: Sandbox | None = None
        try:
            sandbox, base = await self._phase("environment", self.rig.timeouts.environment_s, self._environment,
                                              on_error=environment_status)
            self._cpu_before = await _cpu_seconds(sandbox)
            await self._phase("harness_setup", self.rig.timeouts.harness_setup_s,
                              lambda: setup_harness(self.rig.harness, self._visible_task(), sandbox),
                              on_error=harness_setup_status, skip_if=lambda: not hasattr(self.rig.harness, "setup"))
            trajectory = await self._agent(sandbox)
            self._blame_the_user_simulator(trajectory)
            await keep_native_logs(sandbox, trajectory, self.rig.out_dir, self.key)
            keep_images(trajectory, self.rig.out_dir)
            await self._services_after_agent(sandbox, trajectory)
            if counts(trajectory):
                patch = await self._after_agent(sandbox, base, trajectory)
        except PhaseFailed as failure:
            assert failure.status is not None
            trajectory = self._errored(trajectory, failure.status, str(failure))
        finally:
            if sandbox is not None:
                await _close_quietly(sandbox)
        return trajectory, patch

    async def _environment(self) -> tuple[Sandbox, str | None]:
        problem = self.task.metadata.get(LOAD_ERROR_KEY)
        if problem:
            raise InvalidRequest(str(problem))
        overrides = sandbox_overrides(self.task, self.rig.bundle) if self.rig.bundle else {}
        overrides["timeout_s"] = self._sandbox_ttl(self.deadline.time_left_s())
        task = self.task
        if self.rig.user_model and user_services(task):  # its user answers with the run's user model
            task = with_user_model(task, self.rig.gateway, self.key, self.rig.user_model)
            overrides["network"] = overrides.get("network", task.environment.network).model_copy(
                update={"gateway": True})
        sandbox = await create_task_sandbox(self.rig.orch, task, labels=self.labels, **overrides)
        # What the SDK's sandboxes carry (AgentSandbox.startup); another SandboxFactory's may not.
        self.sandbox_startup = getattr(sandbox, "startup", None)
        try:
            base = None
            if isinstance(self.task.grader, SWETestsGrader):
                base = await snapshot_base(sandbox, self.task.environment.workdir)
            return sandbox, base
        except BaseException:
            await _close_quietly(sandbox)
            raise

    async def _agent(self, sandbox: Sandbox) -> Trajectory:
        """The agent's run, cut off at its deadline. Whatever happens the trajectory comes back: the
        harness's own, or (timeout, crash) the steps rebuilt from the gateway's records."""
        budget = self._agent_budget()
        deadline = Deadline.after(budget)  # the agent's: the harness is told it, and cut off there
        model = ModelConfig(model=self.rig.model, base_url=self.rig.gateway.base_url,
                            api_key=SecretStr(self.rig.gateway.api_key), rollout_key=self.key,
                            sampling=self.rig.sampling, deadline=deadline)
        if self.rig.bundle:
            model = inside_model(model, self.rig.gateway)
        hooks = self._rollout_hooks()
        prepared = False
        record = self._open_phase("agent", budget)
        started = time.monotonic()
        cutoff = asyncio.timeout(deadline.time_left_s())
        try:
            if hooks is not None:
                try:
                    hooks.prepare_rollout(self.key, self.task)
                except OrchardError as exc:  # the model cannot play this task (e.g. the oracle: no patch)
                    raise ModelError(f"model {self.rig.model!r} cannot run task {self.task.id!r}: {exc}") from exc
                prepared = True
            async with cutoff:
                trajectory = await self.rig.harness.run(self._visible_task(), sandbox, model)
            if not isinstance(trajectory, Trajectory):
                raise TypeError(f"harness {self.rig.harness.name!r} returned {type(trajectory).__name__}, "
                                "not a Trajectory")
            if getattr(self.rig.harness, "steps_from_gateway", False):
                calls = self.rig.gateway.gateway.calls(self.key)
                trajectory.steps = trajectory_from_calls(calls, self._agent_record()).steps
                trajectory.agent.tool_definitions = trajectory.agent.tool_definitions or offered_tools(calls)
                blame_a_failed_model_call(trajectory, calls)
        except TimeoutError as exc:
            if not cutoff.expired():  # the harness's own timeout escaped it: a crash like any other
                log.exception("harness %s crashed on task %s", self.rig.harness.name, self.task.id)
                trajectory = self._partial("agent_error", f"harness crashed: TimeoutError: {exc}")
            else:
                trajectory = self._partial("timeout", f"timeout: the agent ran past the task timeout of {budget:g} s"
                                                      + ("" if budget == self._agent_limit()
                                                         else " (what was left of the trial's deadline)"))
        except ModelError as exc:
            trajectory = self._partial("model_error", f"{exc.code}: {exc}")
        except OrchardError as exc:
            trajectory = self._partial("sandbox_error", f"{exc.code}: {exc}")
        except Exception as exc:  # a harness bug must not stop the run: the rollout is an error, logged
            log.exception("harness %s crashed on task %s", self.rig.harness.name, self.task.id)
            trajectory = self._partial("agent_error", f"harness crashed: {type(exc).__name__}: {exc}")
        finally:
            if prepared:
                assert hooks is not None
                _end_rollout_quietly(hooks, self.key)
            self.agent_wall_s = time.monotonic() - started
        if self.rig.bundle and counts(trajectory) and not self.rig.gateway.gateway.calls(self.key):
            # A program of its own that never reached the model did not attempt the task (misconfigured, or
            # it failed before its first turn): an error, retried on resume, not a failed attempt.
            notes = f" ({trajectory.notes})" if trajectory.notes else ""
            trajectory.outcome = Outcome(error=f"the harness never called the model{notes}")
            trajectory.exit_status = "agent_error"
        settle_exit_status(trajectory)
        error = trajectory.outcome.error if trajectory.outcome else None
        self._close_phase(record, "ok" if error is None else ("timeout" if trajectory.exit_status == "timeout"
                                                                 else "error"), error)
        return trajectory

    async def _services_after_agent(self, sandbox: Sandbox, trajectory: Trajectory) -> None:
        """The services' logs kept with the trial; a service that died meanwhile is the environment's error."""
        if not self.task.environment.all_services:
            return
        trajectory.extra[SERVICE_LOGS] = await keep_service_logs(sandbox, self.task, self.rig.out_dir, self.key)
        if counts(trajectory):
            try:
                await check_services(sandbox, self.task)
            except ServiceFailed as exc:
                raise PhaseFailed("environment_error", str(exc)) from exc

    async def _after_agent(self, sandbox: Sandbox, base: str | None, trajectory: Trajectory) -> str | None:
        """The patch (SWE) or the script grader's outcome (script tasks), read before the sandbox goes."""
        cpu_before = self._cpu_before
        grader = self.task.grader
        patch = None
        if isinstance(grader, SWETestsGrader) and base is not None:
            try:
                patch = await self._phase("patch", self.rig.timeouts.patch_s,
                                          lambda: extract_patch(sandbox, self.task.environment.workdir, base),
                                          on_error=patch_status)
            except PhaseFailed as failure:
                if failure.status is not None:
                    raise
                trajectory.outcome = Outcome(resolved=False, reward=0.0, details={"patch_error": str(failure)})
        elif isinstance(grader, ScriptGrader):
            trajectory.outcome = await self._phase("verify", self.rig.timeouts.verify_s,
                                                   lambda: grade_script(sandbox, self.task,
                                                                        pass_threshold=self.rig.pass_threshold),
                                                   on_error=grader_status)
        elif isinstance(grader, ServicesGrader):
            trajectory.outcome = await self._phase("verify", self.rig.timeouts.verify_s,
                                                   lambda: grade_services(sandbox, self.task,
                                                                          pass_threshold=self.rig.pass_threshold,
                                                                          final_text=final_text(trajectory),
                                                                          gateway=self.rig.gateway,
                                                                          rollout_key=self.key),
                                                   on_error=grader_status)
        cpu_after = await _cpu_seconds(sandbox)
        if cpu_before is not None and cpu_after is not None:
            self.cpu_s = max(0.0, cpu_after - cpu_before)
        return patch

    async def _verify(self, patch: str) -> Outcome:
        # Waiting for a grading slot is the scheduler's doing: the trial's clock stops meanwhile.
        waited = time.monotonic()
        async with self.rig.grading_slots:
            self.deadline = self.deadline.later_by(time.monotonic() - waited)
            try:
                outcome = await self._phase(
                    "verify", self.rig.timeouts.verify_s,
                    lambda: grade_swe_patch(self.rig.orch, self.task, patch, labels=self.labels,
                                            sandbox_ttl_s=self._sandbox_ttl(self.rig.timeouts.verify_s)),
                    on_error=grader_status)
            except PhaseFailed as failure:
                return Outcome(error=f"grading: {failure}", details={"patch": patch})
        outcome.details["patch"] = patch
        return outcome

    # --- phase bookkeeping ---------------------------------------------------------------------------

    async def _phase(self, name: PhaseName, limit: float, work: Callable[[], Awaitable[_T]], *,
                     on_error: Callable[[BaseException], ExitStatus | None],
                     skip_if: Callable[[], bool] | None = None) -> _T:
        if skip_if is not None and skip_if():
            self.phases.append(PhaseRecord(name=name, result="skipped"))
            return None  # type: ignore[return-value]
        budget = min(limit, self.deadline.time_left_s())
        record = self._open_phase(name, budget)
        cutoff = asyncio.timeout(budget)
        try:
            async with cutoff:
                value = await work()
        except TimeoutError as exc:
            if cutoff.expired():
                message = f"{name.replace('_', ' ')} ran past its {budget:.0f} s"
                self._close_phase(record, "timeout", message)
                raise PhaseFailed(on_error(TimeoutError(message)), message) from None
            self._close_phase(record, "error", f"TimeoutError: {exc}")
            raise PhaseFailed(on_error(exc), f"{name.replace('_', ' ')}: TimeoutError: {exc}") from None
        except Exception as exc:
            message = f"{exc.code}: {exc}" if isinstance(exc, OrchardError) else f"{type(exc).__name__}: {exc}"
            self._close_phase(record, "error", message)
            if not isinstance(exc, OrchardError):
                log.exception("%s phase failed on task %s", name, self.task.id)
            raise PhaseFailed(on_error(exc), f"{name.replace('_', ' ')}: {message}") from None
        self._close_phase(record, "ok", None)
        return value

    _cpu_before: float | None = None

    def _open_phase(self, name: PhaseName, budget: float) -> PhaseRecord:
        record = PhaseRecord(name=name, result="ok", started_at=datetime.now(timezone.utc).isoformat(),
                             timeout_s=round(budget, 3))
        record.duration_s = time.monotonic()  # the start, until closed
        self.phases.append(record)
        self._open.add(name)
        self._save_phases()
        return record

    def _close_phase(self, record: PhaseRecord, result: str, error: str | None) -> None:
        record.duration_s = max(0.0, time.monotonic() - record.duration_s)
        record.result, record.error = result, error  # type: ignore[assignment]
        self._open.discard(record.name)
        self._save_phases()

    def _sandbox_ttl(self, needed_s: float) -> float:
        """The TTL of a sandbox needed for `needed_s` more (at most what is left of the trial), with a margin."""
        return max(0.0, min(needed_s, self.deadline.time_left_s())) + SANDBOX_TTL_MARGIN_S

    def _agent_limit(self) -> float:
        """The run's limit on the agent, or the task's own where lower."""
        return min(self.rig.timeouts.agent_s, self.task.agent_timeout_s or self.rig.timeouts.agent_s)

    def _agent_budget(self) -> float:
        """The agent's limit, leaving the trial time to take and grade the patch when it can."""
        left = self.deadline.time_left_s()
        reserve = self.rig.timeouts.patch_s + self.rig.timeouts.verify_s
        budget = left - reserve if left - reserve > 0 else left
        return max(0.0, min(self._agent_limit(), budget))

    def _rollout_hooks(self) -> RolloutHooks | None:
        """The rollout hooks of the policy the run's model reaches through the gateway (one of Orchard's own
        models that has them, like the oracle), else None. A model the gateway cannot route or load has
        none here: its first call fails with the reason, as a model_error."""
        from orchard.policies.registry import policy_for_route

        try:
            policy = policy_for_route(self.rig.gateway.gateway.config.route(self.rig.model).model)
        except OrchardError:
            return None
        return policy if isinstance(policy, RolloutHooks) else None

    # --- results -------------------------------------------------------------------------------------

    def _visible_task(self) -> Task:
        return self.task.model_copy(update={"grader": None})  # tests and gold patch stay with the grader

    def _agent_record(self) -> Agent:
        return Agent(name=self.rig.harness.name, version=self.rig.harness.version, model_name=self.rig.model)

    def _partial(self, status: ExitStatus, error: str) -> Trajectory:
        """The steps the gateway recorded for this rollout, as the harness could not return its own."""
        trajectory = trajectory_from_calls(self.rig.gateway.gateway.calls(self.key), self._agent_record())
        trajectory.exit_status, trajectory.outcome, trajectory.notes = status, Outcome(error=error), error
        return trajectory

    def _errored(self, trajectory: Trajectory | None, status: ExitStatus, error: str) -> Trajectory:
        if trajectory is None:
            trajectory = Trajectory(agent=self._agent_record())
        trajectory.exit_status, trajectory.notes = status, error
        trajectory.outcome = Outcome(error=error, details=(trajectory.outcome.details if trajectory.outcome
                                                           else {}))
        return trajectory

    def _blame_the_user_simulator(self, trajectory: Trajectory) -> None:
        """A failed call of the simulated user's model ends the rollout as a model_error: the agent was
        answered by an error it could not help."""
        if not (self.rig.user_model and user_services(self.task)) or not counts(trajectory):
            return
        failed = failed_user_call(self.rig.gateway.gateway.calls(user_rollout_key(self.key)))
        if failed is not None:
            error = f"model_error: the simulated user's model {self.rig.user_model!r} failed: {failed.error}"
            trajectory.exit_status, trajectory.notes = "model_error", error
            trajectory.outcome = Outcome(error=error)

    def _finish(self, trajectory: Trajectory) -> Trajectory:
        """The trajectory as recorded: the gateway's calls attached (steps pointing at them), the
        accounting from those calls, the task, key and phases set; a simulated user's calls apart."""
        calls = self.rig.gateway.end_rollout(self.key) or self._earlier_calls
        if user_services(self.task):
            user_calls = self.rig.gateway.end_rollout(user_rollout_key(self.key))
            if user_calls or USER_EXTRA not in trajectory.extra:  # a checkpointed rollout's are kept
                trajectory.extra[USER_EXTRA] = user_record(self.rig.user_model, user_calls)
        data = trajectory.model_dump()
        data["steps"] = link_steps_to_calls(data["steps"], calls)
        data.update(task_id=self.task.id, rollout_key=self.key, llm_calls=[call.model_dump() for call in calls],
                    phases=[phase.model_dump() for phase in self.phases])
        data["agent"]["model_name"] = data["agent"].get("model_name") or self.rig.model
        data["final_metrics"] = FinalMetrics.from_llm_calls(
            calls, total_steps=len(data["steps"]), wall_time_s=time.monotonic() - self.started,
            sandbox_cpu_s=self.cpu_s, sandbox_startup=self.sandbox_startup).model_dump()
        if data.get("outcome") is None:
            data["outcome"] = Outcome(error="not graded: the task has no grader").model_dump()
            data["exit_status"] = data.get("exit_status") or "grader_error"
        try:
            return Trajectory.model_validate(data)
        except ValidationError as exc:  # what the harness returned does not hold together: its error, kept
            error = f"agent_error: the harness returned an invalid trajectory: {first_problem(exc.errors())}"
            log.error("task %s: %s", self.task.id, error)
            rebuilt = trajectory_from_calls(calls, self._agent_record())  # the steps, from the gateway's records
            kept = {key: data[key] for key in ("task_id", "rollout_key", "llm_calls", "phases", "final_metrics")}
            return Trajectory.model_validate({
                **kept, "agent": rebuilt.agent.model_dump(), "steps": [step.model_dump() for step in rebuilt.steps],
                "exit_status": "agent_error", "partial": True, "notes": error,
                "outcome": Outcome(error=error).model_dump(), "extra": {"invalid_trajectory": str(exc)[:4000]}})


async def _cpu_seconds(sandbox: Sandbox) -> float | None:
    with contextlib.suppress(OrchardError):
        return await sandbox_cpu_seconds(sandbox)
    return None


def _end_rollout_quietly(hooks: RolloutHooks, rollout_key: str) -> None:
    try:
        hooks.end_rollout(rollout_key)
    except Exception:  # a policy's cleanup must not turn the rollout into an error
        log.exception("end_rollout(%s) of the model's policy failed", rollout_key)


async def _close_quietly(sandbox: Sandbox) -> None:
    try:
        await sandbox.close()
    except OrchardError as exc:  # the sandbox is gone either way; the factory's close retries
        log.warning("deleting sandbox %s failed: %s", sandbox.id, exc)
