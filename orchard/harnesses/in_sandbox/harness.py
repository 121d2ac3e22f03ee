"""The one base of every harness whose agent runs *inside* the sandbox from a harness bundle (kimi-cli,
openhands, cli). An adapter declares its bundle, its state dir and its time limits as class attributes and
answers four questions; the base does the rest, the same way for each:

- `launch`: how the agent is started (files to place, command line, environment, stdin: `Launch`);
- `collect`: what it left, read back from the sandbox (its native log, as far as it exists);
- `convert`: that log (None: it could not be read after the adapter's own stop) and the command's
  result as the Trajectory, with `extra["native_logs"]`, what the evaluator keeps beside it;
- `ending`: how the run ended (`Ending`: exit status, error, notes, partial).

`run` makes the state dir, places the files, runs the command killed with its process group a margin before
the evaluator's deadline (orchard/harnesses/deadline.py), collects the log (once its own stop fired, only for
as long as the deadline allows: the rollout is the agent's timeout either way) and returns the converted
trajectory with its task, rollout key and ending. The model calls themselves are the gateway's records: the
evaluator links each agent step to its call by `extra["response_id"]`, or rebuilds the steps from them when
the adapter says `steps_from_gateway`."""

from __future__ import annotations

from typing import Any, ClassVar

from orchard.core.harness import ModelConfig
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Trajectory
from orchard.harnesses.deadline import after_stop, run_limit_s
from orchard.harnesses.in_sandbox.descriptor import AgentRun, Ending, Finished, Launch

STATE_DIR_TIMEOUT_S = 30


class InSandboxHarness:
    """Subclass it with `name`, `version`, `bundle`, `state_dir` and the four methods below."""

    name: ClassVar[str]
    version: ClassVar[str]
    # The harness bundle it runs from (the evaluator mounts it and gives the sandbox the gateway): a class
    # attribute, or the instance's own where it is an option (cli).
    bundle: str
    state_dir: ClassVar[str]  # made before the launch: what the adapter writes, outside every task's workdir
    time_limit_s: ClassVar[float | None] = None  # the longest a run takes, with or without a deadline
    default_time_limit_s: ClassVar[float | None] = None  # the longest without a deadline (None: no limit)
    timeout_s: float | None = None  # the user's own limit (an option), below the evaluator's deadline
    steps_from_gateway: ClassVar[bool] = False  # True: the evaluator builds the steps from the gateway's records

    async def launch(self, run: AgentRun, sandbox: Sandbox) -> Launch:
        raise NotImplementedError

    async def collect(self, run: AgentRun, sandbox: Sandbox, result: ExecResult) -> Any:
        raise NotImplementedError

    def convert(self, log: Any, run: AgentRun, result: ExecResult) -> Trajectory:
        raise NotImplementedError

    def ending(self, run: AgentRun, finished: Finished, log: Any, trajectory: Trajectory) -> Ending:
        raise NotImplementedError

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        run = AgentRun(task=task, model=model, spec=get_bundle_spec(self.bundle),
                       time_limit_s=run_limit_s(model, self.timeout_s or self.time_limit_s,
                                                self.default_time_limit_s))
        await sandbox.exec(["mkdir", "-p", self.state_dir], timeout=STATE_DIR_TIMEOUT_S)
        launch = await self.launch(run, sandbox)
        for file in launch.files:
            await sandbox.write_file(file.path, file.data, mode=file.mode)
        result = await sandbox.exec(launch.argv, cwd=run.workdir, env=launch.env, stdin=launch.stdin,
                                    timeout=run.time_limit_s)
        unread = None
        if result.timed_out:  # our own stop fired: the agent's timeout, whatever the reading meets
            log, unread = await after_stop(model, lambda: self.collect(run, sandbox, result))
        else:
            log = await self.collect(run, sandbox, result)
        trajectory = self.convert(log, run, result)
        trajectory.task_id, trajectory.rollout_key = task.id, model.rollout_key
        end = self.ending(run, Finished(result=result, unread=unread), log, trajectory)
        trajectory.exit_status, trajectory.partial = end.exit_status, end.partial
        if end.error is not None:
            trajectory.outcome = Outcome(error=end.error)
        if end.notes is not None:
            trajectory.notes = end.notes
        return trajectory

    def agent(self, run: AgentRun, **fields: Any) -> Agent:
        """The trajectory's agent record: this harness, the run's model."""
        return Agent(name=self.name, version=self.version, model_name=run.model.model, **fields)
