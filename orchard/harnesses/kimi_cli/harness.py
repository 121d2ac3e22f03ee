"""The `kimi-cli` harness: the real Kimi-CLI (its pinned bundle) run inside the task's sandbox in print mode,
auto-approving, with the run's gateway as its OpenAI-compatible provider; its session logs (`wire.jsonl`,
`context.jsonl`) become the Trajectory (convert.py). Kimi is stopped a margin before the evaluator's deadline
(orchard/harnesses/deadline.py); once that stop fired, the rollout is the agent's `timeout` even when its logs
cannot be read in time."""

from __future__ import annotations

from orchard.core.harness import ModelConfig
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Trajectory
from orchard.harnesses.deadline import after_stop, run_limit_s
from orchard.harnesses.kimi_cli import launch
from orchard.harnesses.kimi_cli.convert import KimiSession, trajectory_from_session

NAME = "kimi-cli"
VERSION = "1.51.0"  # the bundle's pin (bundle.py)
DEFAULT_STEP_LIMIT = 100
DEFAULT_TIMEOUT_S = 3600.0
STDERR_TAIL = 2000


class KimiCliHarness:
    """Kimi-CLI 1.51.0 from its harness bundle, one print-mode turn per task."""

    name = NAME
    version = VERSION
    bundle = "kimi-cli"

    def __init__(self, step_limit: int = DEFAULT_STEP_LIMIT, max_context_size: int = launch.DEFAULT_CONTEXT_SIZE,
                 timeout_s: float | None = None) -> None:
        self.step_limit = step_limit
        self.max_context_size = max_context_size
        self.timeout_s = timeout_s

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        spec = get_bundle_spec(self.bundle)
        workdir = task.environment.workdir
        await sandbox.exec(["mkdir", "-p", launch.SHARE_DIR], timeout=30)
        await sandbox.write_file(launch.CONFIG_FILE, launch.config_toml(
            model, max_context_size=self.max_context_size, max_steps=self.step_limit).encode(), mode=0o600)
        result = await sandbox.exec(launch.command(spec, workdir), cwd=workdir, stdin=task.instruction,
                                    env=launch.environment(spec), timeout=self._timeout(model))
        unread = None
        if result.timed_out:  # our own stop fired: the agent's timeout, whatever the reading meets
            read, unread = await after_stop(model, lambda: KimiSession.read(sandbox, launch.SHARE_DIR))
            session = read if read is not None else KimiSession()
        else:
            session = await KimiSession.read(sandbox, launch.SHARE_DIR)
        trajectory = trajectory_from_session(session, agent=Agent(name=self.name, version=self.version,
                                                                  model_name=model.model))
        trajectory.task_id = task.id
        trajectory.extra["native_logs"] = session.native_logs()
        trajectory.extra["kimi_exit_code"] = result.exit_code
        error = _failure(result, session, trajectory)
        if unread is not None:
            error = f"{error}; {unread}"
        if error is not None:
            trajectory.outcome = Outcome(error=error)
            trajectory.partial = True
        elif trajectory.exit_status is None:
            trajectory.exit_status = "stopped"  # exited cleanly without ending its turn in the log
        return trajectory

    def _timeout(self, model: ModelConfig) -> float:
        limit = run_limit_s(model, self.timeout_s or DEFAULT_TIMEOUT_S)
        assert limit is not None
        return limit


def _failure(result: ExecResult, session: KimiSession, trajectory: Trajectory) -> str | None:
    """Why the run is an error rather than an attempt, with Kimi's stderr tail; None when Kimi ended its turn."""
    tail = (result.stderr or "")[-STDERR_TAIL:].strip()
    said = f"; stderr: {tail}" if tail else ""
    printed = (result.stdout or "").strip().splitlines()[-1:]  # print mode prints its error as the last line
    if printed and not printed[0].startswith("{"):
        said = f"; it said: {printed[0][-STDERR_TAIL:]}{said}"
    if result.timed_out:
        trajectory.exit_status = "timeout"
        return f"kimi-cli ran past its time limit and was killed with its process group{said}"
    if result.exit_code != 0 and session.max_steps_reached:
        trajectory.exit_status = "step_limit"  # its own limit: an attempt, graded
        return None
    if session.model_failed is not None or result.exit_code == 75:  # 75: Kimi's "retryable" provider failure
        trajectory.exit_status = "model_error"
        return f"kimi-cli's model calls failed: {session.model_failed or 'the provider was unreachable'}{said}"
    if result.exit_code != 0:
        trajectory.exit_status = "agent_error"
        return f"kimi-cli exited with code {result.exit_code}{said}"
    if not session.model_called:
        trajectory.exit_status = "agent_error"
        return f"kimi-cli never called the model{said}"
    return None
