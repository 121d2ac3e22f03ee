"""`run_eval`: run a harness with a model over a suite's tasks, one Trial per task (orchard.eval.trial), and
record everything in the output directory (orchard.eval.results).

At most `parallel` agents run at once, and as many gradings beside them. Each trial's model calls go through
the run's own gateway under the rollout key `<run_id>:<task_id>:<attempt>`, and the gateway appends each
call to OUT/calls.jsonl as it finishes: a per-turn checkpoint. A finished trial appends one line to
trajectories.jsonl and rewrites results.json.

**Attempts.** Each task gets `attempts` K finished attempts: rollouts with an agent outcome (resolved or
failed). A rollout that ended in an error is not an attempt; a session runs at most `error_retries` more
rollouts of a task to replace its errored ones, and a task still short of K attempts says how many it has
(results.json). A task's attempts run as separate trials, in rounds: every task's first attempt is queued
before any task's second, so a run stopped early has the most tasks with an attempt.

Resuming (the same command, the same --out) is exact: the configuration must be the same (it is the resume
key, OUT/config.json); attempts are never run again (a task with its K attempts is done; asking for more
attempts adds only the missing ones); a trial that ended in an error is replaced by the next rollout; a
trial that was in flight when the run was stopped — Ctrl-C, or a kill at any moment — is first recorded
from its checkpointed calls as an `interrupted` partial rollout (nothing the agent did is lost), then run
again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

from orchard.core.backend import BackendConfig
from orchard.core.errors import InvalidRequest
from orchard.core.harness import Harness, SamplingParams, get_harness
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.jsonl import write_jsonl
from orchard.core.pool import PoolSpec
from orchard.core.sandbox import SandboxFactory
from orchard.core.task import Task
from orchard.core.task_suite import TaskSuite
from orchard.core.trajectory import Agent, FinalMetrics, Outcome, Trajectory
from orchard.eval.checkpoint import read_checkpoint, read_checkpoints, remove_checkpoint
from orchard.eval.domains import task_domain
from orchard.eval.in_sandbox import (backend_for_run, ensure_run_bundle, gateway_host, harness_bundle,
                                     with_run_gateway)
from orchard.eval.local_gateway import LocalGateway
from orchard.eval.pools import eval_pools
from orchard.eval.partial import CALLS_FILE, read_calls, trajectory_from_calls
from orchard.eval.results import (TRAJECTORIES_FILE, EvalResults, EvalSettings, TaskResult, attempts_by_task,
                                  build_results, read_results, read_trajectories, rollout_status, utc_now,
                                  write_results)
from orchard.eval.models import check_model_route
from orchard.eval.run_config import (TrialTimeouts, check_same_config, harness_defaults, read_config, suite_hash,
                                     write_config)
from orchard.eval.image_build.prepare import prepare_task_images
from orchard.eval.suites import load_suite, select_tasks
from orchard.eval.trial import Trial, TrialRig
from orchard.eval.user_simulator import check_user_model, uses_user_model
from orchard.gateway.config import GatewayConfig
from orchard.harnesses.mcp import check_pairing
from orchard.sandbox.client import AsyncOrchard

log = logging.getLogger(__name__)

DEFAULT_TASK_TIMEOUT_S = TrialTimeouts().agent_s
RUN_LABEL, TASK_LABEL = "orchard.eval/run", "orchard.eval/task"
INTERRUPTED = "interrupted: orchard eval stopped while this trial ran; its steps are those the gateway recorded"


class EvalListener(Protocol):
    """Told about progress (the CLI draws a progress bar with it)."""

    def run_started(self, results: EvalResults, to_run: list[str]) -> None: ...
    def task_finished(self, result: TaskResult) -> None: ...
    # Optional: `preparing(step: str)`, told what the run does before its first task (building an in-sandbox
    # harness's bundle: minutes the first time); `retrying(task_id: str)`, told that a rollout ended in an
    # error and another one replaces it (one more trial than `run_started` said).


def rollout_key(run_id: str, task_id: str, attempt: int) -> str:
    # The gateway's keys cannot hold '/', so the parts are joined by ':' and a task id is %-quoted.
    return f"{run_id}:{quote(task_id, safe='')}:{attempt}"


def parse_rollout_key(key: str) -> tuple[str, str, int] | None:
    """(run id, task id, attempt) of a key made by `rollout_key`, None for any other key."""
    parts = key.rsplit(":", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], unquote(parts[1]), int(parts[2])


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


async def run_eval(*, harness: str, model: str, suite: str | Path | TaskSuite, out_dir: str | Path,
                   gateway_config: GatewayConfig, task_ids: list[str] | None = None, parallel: int = 4,
                   harness_options: dict[str, Any] | None = None, sampling: SamplingParams | None = None,
                   timeouts: TrialTimeouts | None = None,
                   orchard_url: str | None = None, orchard_client: SandboxFactory | None = None,
                   backend: BackendConfig | str | None = None, listener: EvalListener | None = None,
                   pool: int = 0, attempts: int = 1, error_retries: int = 0,
                   pass_threshold: float | None = None, user_model: str | None = None) -> EvalResults:
    """Evaluate and return the results (also in `out_dir`). Everything a user can get wrong (unknown
    harness, suite or task, an output directory holding another configuration or a file) is refused
    before anything is written. `gateway_config` says which models the run's gateway serves (see
    `orchard.eval.models`). `timeouts`: the trials' limits (the agent's is `agent_s`).
    Sandboxes come from `orchard_client` when given (it stays open), else from a client of its own:
    embedded on `backend` (a config or a backend's name; default local), or the server at `orchard_url` /
    ORCHARD_URL. `pool`: keep this many sandboxes of each task template started in the run's own
    orchestrator (embedded only; a server's pools are its own, `orchard serve --pools`). `attempts`: the
    finished attempts each task gets (a resumed run keeps the most any of its sessions asked for);
    `error_retries`: how many more rollouts of a task this session may run to replace errored ones (0: they
    run again when the run is resumed). `pass_threshold`: the least reward that resolves a task (default: the
    suite's, 1.0 unless its suite.json says otherwise). `user_model`: the model that plays the tasks' simulated
    users (user_simulator.py; default: their scripts)."""
    if parallel < 1:
        raise InvalidRequest(f"parallel must be at least 1, got {parallel}")
    if attempts < 1:
        raise InvalidRequest(f"attempts must be at least 1, got {attempts}")
    if error_retries < 0:
        raise InvalidRequest(f"error retries must be 0 or more, got {error_retries}")
    if pass_threshold is not None and not 0 < pass_threshold <= 1:
        raise InvalidRequest(f"the pass threshold is a reward in (0, 1], got {pass_threshold}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidRequest(f"--out {out} is a file; give a directory (it is created if missing)")
    timeouts = timeouts or TrialTimeouts()
    options = dict(harness_options or {})
    agent = get_harness(harness, **options)
    bundle = harness_bundle(agent)
    if bundle:
        get_bundle_spec(bundle)  # an unknown bundle is refused before anything is written
    check_model_route(gateway_config, model)  # a model no provider serves is refused before any sandbox
    if user_model:
        check_model_route(gateway_config, user_model)
    loaded = load_suite(suite)
    tasks = select_tasks(loaded, task_ids)
    check_pairing(agent, tasks)  # a task's MCP tools need a harness that takes them: refused before any sandbox
    check_user_model(tasks, user_model)
    if bundle or uses_user_model(tasks, user_model):  # sandboxes reach the run's gateway
        backend = backend_for_run(backend, orchard_url, orchard_client is not None)
        gateway_host(backend)  # where the run's gateway would listen for the sandboxes: refused now if unknown
    settings = EvalSettings(harness=harness, harness_version=agent.version, harness_options=options, model=model,
                            sampling=sampling or SamplingParams(), suite=loaded.name, suite_hash=suite_hash(loaded),
                            timeouts=TrialTimeouts.model_validate(timeouts.model_dump()),
                            pass_threshold=loaded.pass_threshold if pass_threshold is None else pass_threshold,
                            suite_path=None if isinstance(suite, TaskSuite) else str(suite),
                            task_ids=[task.id for task in tasks], parallel=parallel, attempts=attempts,
                            error_retries=error_retries, user_model=user_model,
                            task_domains={task.id: task_domain(task) for task in tasks})
    previous = read_results(out)
    previous_config = read_config(out)
    if previous is not None and previous_config is None:
        raise InvalidRequest(f"{out} holds a run without its configuration (config.json), written by an older "
                             "Orchard; its results cannot be resumed safely. Choose another --out")
    if previous_config is not None:
        check_same_config(previous_config, settings.config(), out, harness_defaults=harness_defaults(harness))
    if pool < 0:
        raise InvalidRequest(f"pool must be 0 or more, got {pool}")
    if pool and (orchard_client is not None or orchard_url or os.environ.get("ORCHARD_URL")):
        raise InvalidRequest("--pool keeps warm sandboxes in the run's own (in-process) orchestrator; a server's "
                             "pools are its own: start it with `orchard serve --pools FILE` (docs/pools.md), or "
                             "drop --pool")
    # images built from a task's Dockerfile, once; a task whose image cannot be built is that task's error
    tasks = await prepare_task_images(tasks, backend=backend, orchard_url=orchard_url, client=orchard_client)
    run = _Run(agent, tasks, out, settings, previous, listener)
    run.pools = eval_pools(tasks, pool, bundle)
    return await run.execute(gateway_config, parallel, orchard_url, orchard_client, backend)


class _Run:
    def __init__(self, harness: Harness, tasks: list[Task], out: Path, settings: EvalSettings,
                 previous: EvalResults | None, listener: EvalListener | None) -> None:
        self.harness, self.tasks, self.out, self.listener = harness, tasks, out, listener
        # A resumed run keeps its id (rollout keys stay unique) and start time; settings may grow tasks.
        self.run_id = previous.run_id if previous else new_run_id()
        self.started_at = previous.started_at if previous else utc_now()
        self.elapsed_before = previous.elapsed_s if previous else 0.0
        self.session_started = time.monotonic()
        if previous is not None:
            settings.task_ids = list(dict.fromkeys(previous.settings.task_ids + settings.task_ids))
            settings.attempts = max(settings.attempts, previous.settings.attempts)
        self.settings = settings
        self.trajectories = read_trajectories(out)
        self.pools: list[PoolSpec] = []  # warm pools for the run's own orchestrator (--pool)
        self.last_rollout: dict[str, int] = {}  # per task: the highest rollout number taken (keys stay unique)
        self.to_grade: dict[str, list[int]] = {}  # per task: rollouts whose agent finished in an earlier session
        self.retries_left: dict[str, int] = {}  # per task: rollouts this session may still run to replace errors

    def _recover_interrupted(self) -> None:
        """Record every rollout that has checkpointed calls but no trajectory (the run was stopped while it
        ran) as an interrupted partial rollout, so its steps and the phases it ran are kept and its attempt
        number is used up. A rollout whose agent had finished is not: its trial is graded on resume
        (orchard.eval.checkpoint). Checkpoints of nothing left to do are removed."""
        recorded = {trajectory.rollout_key for trajectory in self.trajectories}
        checkpoints = read_checkpoints(self.out)
        calls_by_key = read_calls(self.out)
        for key, checkpoint in checkpoints.items():
            parsed = parse_rollout_key(key)
            if key in recorded or parsed is None or parsed[0] != self.run_id or (
                    not checkpoint.to_grade and key not in calls_by_key):
                remove_checkpoint(self.out, key)  # recorded, another run's, or nothing to keep: runs again
        for key, calls in calls_by_key.items():
            parsed = parse_rollout_key(key)
            checkpoint = checkpoints.get(key)
            if key in recorded or parsed is None or parsed[0] != self.run_id or (checkpoint and checkpoint.to_grade):
                continue
            agent = Agent(name=self.settings.harness, version=self.settings.harness_version or "",
                          model_name=self.settings.model)
            trajectory = trajectory_from_calls(calls, agent)
            trajectory.task_id, trajectory.rollout_key, trajectory.llm_calls = parsed[1], key, calls
            trajectory.exit_status, trajectory.notes = "interrupted", INTERRUPTED
            trajectory.outcome = Outcome(error=INTERRUPTED)
            trajectory.final_metrics = FinalMetrics.from_llm_calls(calls, total_steps=len(trajectory.steps))
            trajectory.phases = list(checkpoint.phases) if checkpoint else []
            self._append(Trajectory.model_validate(trajectory.model_dump()))
            remove_checkpoint(self.out, key)
            log.warning("recorded the interrupted rollout %s from its %d checkpointed model call(s)", key,
                        len(calls))

    def _to_run(self) -> list[tuple[Task, int]]:
        """Tasks short of their attempts, each with how many trials it needs (a checkpointed rollout whose
        agent finished is one of them: it is graded). Also sets where each task's rollout numbers go on."""
        attempts = attempts_by_task(self.trajectories)
        for trajectory in self.trajectories:
            parsed = parse_rollout_key(trajectory.rollout_key or "")
            if parsed is not None and parsed[0] == self.run_id:
                self.last_rollout[parsed[1]] = max(self.last_rollout.get(parsed[1], 0), parsed[2])
        for key, checkpoint in read_checkpoints(self.out).items():
            parsed = parse_rollout_key(key)
            if parsed is not None and parsed[0] == self.run_id and checkpoint.to_grade:
                self.to_grade.setdefault(parsed[1], []).append(parsed[2])
                self.last_rollout[parsed[1]] = max(self.last_rollout.get(parsed[1], 0), parsed[2])
        pending = []
        for task in self.tasks:
            needed = max(self.settings.attempts - len(attempts.get(task.id, [])), len(self.to_grade.get(task.id, [])))
            if needed > 0:
                pending.append((task, needed))
            self.retries_left[task.id] = self.settings.error_retries
        return pending

    def _next_rollout(self, task_id: str) -> int:
        """The number of the task's next rollout: a checkpointed one to grade first, else a new one."""
        if self.to_grade.get(task_id):
            return self.to_grade[task_id].pop(0)
        self.last_rollout[task_id] = self.last_rollout.get(task_id, 0) + 1
        return self.last_rollout[task_id]

    def results(self, *, interrupted: bool = False) -> EvalResults:
        elapsed = self.elapsed_before + (time.monotonic() - self.session_started)
        return build_results(self.run_id, self.settings, self.started_at, self.trajectories,
                             interrupted=interrupted, elapsed_s=round(elapsed, 3))

    async def execute(self, gateway_config: GatewayConfig, parallel: int, orchard_url: str | None,
                      orchard_client: SandboxFactory | None, backend: BackendConfig | str | None) -> EvalResults:
        self.out.mkdir(parents=True, exist_ok=True)
        write_config(self.out, self.settings.config())
        self._recover_interrupted()
        pending = self._to_run()
        write_results(self.out, self.results())
        bundle = harness_bundle(self.harness)
        if bundle and pending:
            assert isinstance(backend, BackendConfig)  # run_eval resolved it
            progress = getattr(self.listener, "preparing", None) or (lambda step: None)
            await asyncio.to_thread(ensure_run_bundle, bundle, backend, progress)
        if self.listener is not None:
            self.listener.run_started(self.results(), [task.id for task, needed in pending for _ in range(needed)])
        if not pending:
            return self.results()
        finished = False
        final: EvalResults | None = None
        gateway: LocalGateway | None = None
        try:
            # Every call is appended to calls.jsonl as it finishes: the per-turn checkpoint.
            reached = bool(bundle) or uses_user_model(self.tasks, self.settings.user_model)
            host = gateway_host(backend) if reached else "127.0.0.1"
            gateway = LocalGateway(gateway_config.model_copy(update={"record_path": self.out / CALLS_FILE}),
                                   host=host)
            await asyncio.to_thread(gateway.start)
            if reached:
                backend = with_run_gateway(backend, gateway)
            async with contextlib.AsyncExitStack() as stack:
                orch = orchard_client or await stack.enter_async_context(
                    AsyncOrchard(orchard_url, backend=backend, pool=self.pools or None))
                rig = TrialRig(harness=self.harness, model=self.settings.model, sampling=self.settings.sampling,
                               timeouts=self.settings.timeouts, orch=orch, gateway=gateway,
                               agent_slots=asyncio.Semaphore(parallel), grading_slots=asyncio.Semaphore(parallel),
                               bundle=bundle, out_dir=self.out, pass_threshold=self.settings.pass_threshold,
                               user_model=self.settings.user_model)
                async with asyncio.TaskGroup() as group:
                    for round_ in range(max(needed for _, needed in pending)):  # every task's 1st, then 2nd, ...
                        for task, needed in pending:
                            if round_ < needed:
                                group.create_task(self._attempt(rig, task))
            finished = True
        finally:
            if gateway is not None:
                await asyncio.to_thread(gateway.stop)
                gateway.gateway.close()
            if not finished:
                self._recover_interrupted()  # trials cut off by Ctrl-C: their steps so far, recorded now
            final = self.results(interrupted=not finished)
            write_results(self.out, final)
        return final

    async def _attempt(self, rig: TrialRig, task: Task) -> None:
        """One attempt of `task`: a trial, and while it ends in an error and the task has retries left, another."""
        while True:
            trajectory = await self._trial(rig, task, self._next_rollout(task.id))
            if rollout_status(trajectory) != "error" or self.retries_left[task.id] <= 0:
                return
            self.retries_left[task.id] -= 1
            log.info("task %s: the rollout %s ended in an error; running another in its place (%d more allowed)",
                     task.id, trajectory.rollout_key, self.retries_left[task.id])
            retrying = getattr(self.listener, "retrying", None)
            if retrying is not None:
                retrying(task.id)

    async def _trial(self, rig: TrialRig, task: Task, attempt: int) -> Trajectory:
        key = rollout_key(self.run_id, task.id, attempt)
        labels = {RUN_LABEL: self.run_id, TASK_LABEL: _label_value(task.id)}
        trial = Trial(rig, task, key, labels)
        checkpoint = read_checkpoint(self.out, key)  # the agent finished in an earlier session: grade it
        if checkpoint is not None and checkpoint.to_grade:
            log.info("task %s: grading the patch its agent left before the run stopped (%s)", task.id, key)
            trajectory = await trial.grade_checkpointed(checkpoint)
        else:
            trajectory = await trial.run()
        self._record(trajectory, attempt)
        return trajectory

    def _append(self, trajectory: Trajectory) -> None:
        write_jsonl(self.out / TRAJECTORIES_FILE, [trajectory], append=True)
        self.trajectories.append(trajectory)

    def _record(self, trajectory: Trajectory, attempt: int) -> None:
        # Synchronous from here on: a cancellation cannot cut a line or leave results.json behind the file.
        self._append(trajectory)
        if trajectory.rollout_key:
            remove_checkpoint(self.out, trajectory.rollout_key)
        results = self.results()
        write_results(self.out, results)
        if self.listener is not None:
            row = next((row for row in results.tasks if row.task_id == trajectory.task_id), None)
            self.listener.task_finished(TaskResult.from_trajectory(trajectory, attempt,
                                                                   row.attempts if row else None))


def _label_value(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:63]
