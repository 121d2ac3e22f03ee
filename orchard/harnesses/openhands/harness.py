"""OpenHands as an Orchard harness: the OpenHands SDK's own agent (its default coding tools) runs *inside* the
sandbox from the `openhands` harness bundle, through a small driver of ours (driver.py) run by the bundle's
Python; its model is the run's gateway, reached at the rollout's own URL with the rollout's own key.

Each run: the driver (placed in the harness-setup phase) and its config are written under STATE_DIR (outside
the task's workdir, so the patch never picks them up), the driver runs the conversation to its end under the
in-sandbox base's time limit (orchard/harnesses/in_sandbox/), then the conversation's persisted events are
copied out and converted (convert.py) into the Trajectory: OpenHands' own tool names and arguments, the
observations as the model was shown them, each agent step carrying the response id its gateway record has.
The events directory is listed in `extra["native_logs"]`, so the evaluator keeps it beside the trajectory.

A driver that crashes, hangs past its timeout, or whose model calls fail ends the rollout as an error
(`Outcome(error=...)` with the driver's stderr tail), never as a failed attempt. Once the adapter's own kill
fired, the rollout is the agent's `timeout` even when its events cannot be read before the deadline (or the
sandbox fails the reading): the error says so, and the steps are the ones read, if any."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.harness import orchard_version
from orchard.core.run_status import ExitStatus
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Trajectory
from orchard.harnesses.in_sandbox import AgentRun, Ending, Finished, InSandboxHarness, Launch, SandboxFile
from orchard.harnesses.in_sandbox.native_log import read_json, read_jsonl
from orchard.harnesses.mcp.install import mcp_servers
from orchard.harnesses.openhands.bundle import SDK_VERSION, SPEC
from orchard.harnesses.openhands.convert import ConvertedRun, convert_events
from orchard.harnesses.openhands.dialect import OpenHandsDialect

DRIVER_SOURCE = Path(__file__).with_name("driver.py")
STATE_DIR = "/tmp/.orchard-openhands"  # driver, config, the SDK's persisted conversation; outside every workdir
DRIVER_PATH = f"{STATE_DIR}/driver.py"
CONFIG_PATH = f"{STATE_DIR}/config.json"
PERSISTENCE_DIR = f"{STATE_DIR}/conversations"
OBSERVATIONS_PATH = f"{STATE_DIR}/observations.jsonl"
RESULT_PATH = f"{STATE_DIR}/result.json"
HOME_DIR = f"{STATE_DIR}/home"  # the agent's HOME where the sandbox's is the workdir (see launch)
RUN_FAILED = 3  # the driver's exit code when the conversation itself failed (driver.py)
STDERR_TAIL_CHARS = 2000
DRIVER_ENV = {"LOG_LEVEL": "WARNING", "LOG_RICH_TRACEBACKS": "false", "PYTHONUNBUFFERED": "1",
              "NO_COLOR": "1", "TERM": "dumb"}


class OpenHandsHarness(InSandboxHarness):
    name = "openhands"
    mcp_tools = True  # the SDK agent's own MCP client (its mcp_config), given the task's servers
    # The adapter's version with the SDK's as a local label: a change of either changes the resume key.
    version = f"{orchard_version()}+openhands-sdk.{SDK_VERSION}"
    bundle = SPEC.name
    state_dir = STATE_DIR

    def __init__(self, step_limit: int = 100, model_retries: int = 2, retry_wait_s: int = 2,
                 timeout_s: float | None = None, reasoning_effort: str | None = None) -> None:
        """`step_limit`: the conversation's iteration limit (OpenHands' `max_iteration_per_run`, one model call
        each); `model_retries`/`retry_wait_s`: the SDK's own retries of a failed model call; `timeout_s`: the
        driver's wall-time limit (default: what is left before the evaluator's deadline, less a margin);
        `reasoning_effort`: sent to models the SDK thinks reason (its own default, "high", is left out: the
        run's sampling parameters are the evaluator's, and many OpenAI-compatible routes refuse it)."""
        if step_limit < 1 or model_retries < 0 or retry_wait_s < 0 or (timeout_s is not None and timeout_s <= 0):
            raise InvalidRequest("openhands: step_limit must be >= 1, model_retries and retry_wait_s >= 0, "
                                 "timeout_s > 0")
        self.step_limit, self.model_retries, self.retry_wait_s = step_limit, model_retries, retry_wait_s
        self.timeout_s, self.reasoning_effort = timeout_s, reasoning_effort

    def dialect(self) -> OpenHandsDialect:
        """OpenHands' tools, captured prompt and result framing, and the exact replay of its calls (dialect.py)."""
        return OpenHandsDialect(self.name, self.version)

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        """The trial's harness-setup phase: the driver placed under STATE_DIR (a failure is a harness_error)."""
        made = await sandbox.exec(["mkdir", "-p", HOME_DIR])
        if not made.ok:
            raise InvalidRequest(f"openhands: cannot make {HOME_DIR} in the sandbox (the driver and the "
                                 f"conversation's events go there): {made.output.strip()[-500:]}")
        await sandbox.write_file(DRIVER_PATH, DRIVER_SOURCE.read_bytes())

    async def launch(self, run: AgentRun, sandbox: Sandbox) -> Launch:
        """The bundle's Python running the driver on its config, the gateway's key in its environment."""
        model = run.model
        config = {
            "model": f"openai/{model.model}",  # litellm's OpenAI-compatible provider, at the gateway's URL
            "base_url": model.base_url, "workdir": run.workdir, "instruction": run.task.instruction,
            "state_dir": STATE_DIR, "persistence_dir": PERSISTENCE_DIR, "conversation_id": str(run.run_id),
            "max_iterations": self.step_limit, "num_retries": self.model_retries,
            "retry_wait_s": self.retry_wait_s, "request_timeout_s": int(model.timeout_s),
            "sampling": model.sampling.model_dump(exclude_none=True), "reasoning_effort": self.reasoning_effort,
            "mcp_servers": mcp_servers(run.task),  # the agent's own MCP client takes the task's tools
        }
        home = await sandbox.exec(["sh", "-c", 'printf %s "$HOME"'])
        env = {**run.spec.entry_env(), **DRIVER_ENV}
        if _inside(home.stdout.strip(), run.workdir):
            # The agent's shell writes its history (and the SDK its profiles) under HOME: not into the task's
            # repository, where the patch would pick them up. A HOME elsewhere is the task's and kept.
            env["HOME"] = HOME_DIR
        if model.api_key is not None:
            env["ORCHARD_OPENHANDS_API_KEY"] = model.api_key.get_secret_value()
        return Launch(argv=run.spec.entry_argv(DRIVER_PATH, CONFIG_PATH), env=env,
                      files=[SandboxFile(path=CONFIG_PATH, data=json.dumps(config).encode(), mode=0o600)])

    async def collect(self, run: AgentRun, sandbox: Sandbox, result: ExecResult) -> ConvertedRun:
        """The conversation's events, the observation texts and the driver's result, as far as they exist."""
        events_dir = f"{PERSISTENCE_DIR}/{run.run_id.hex}/events"
        with tempfile.TemporaryDirectory(prefix="orchard-openhands-") as tmp:
            local = Path(tmp)
            events: list[dict[str, Any]] = []
            try:
                await sandbox.download(events_dir, local / "events")
            except NotFound:  # the driver died before the conversation started
                pass
            for path in sorted((local / "events").glob("event-*.json")):
                events.append(json.loads(path.read_text()))
        observations = await read_jsonl(sandbox, OBSERVATIONS_PATH)
        driver_result = await read_json(sandbox, RESULT_PATH)
        converted = convert_events(events, observations, driver_result)
        # what exists of the SDK's events and the driver's own files, kept beside the trajectory
        converted.native_logs = [path for path, there in ((events_dir, bool(events)),
                                                          (OBSERVATIONS_PATH, bool(observations)),
                                                          (RESULT_PATH, driver_result is not None)) if there]
        return converted

    def convert(self, converted: ConvertedRun | None, run: AgentRun, result: ExecResult) -> Trajectory:
        converted = converted if converted is not None else convert_events([], [], None)
        trajectory = converted.trajectory(agent_name=self.name, agent_version=self.version, model=run.model.model,
                                          task_id=run.task.id, rollout_key=run.model.rollout_key)
        trajectory.extra["native_logs"] = converted.native_logs
        return trajectory

    def ending(self, run: AgentRun, finished: Finished, converted: ConvertedRun | None,
               trajectory: Trajectory) -> Ending:
        """The conversation's own end, or an error with the driver's stderr tail; `partial` when the driver
        was cut off (its events as far as they go)."""
        result, converted = finished.result, converted if converted is not None else convert_events([], [], None)
        tail = (result.stderr or result.stdout or "").strip()[-STDERR_TAIL_CHARS:]
        status: ExitStatus
        error: str | None = None
        if result.timed_out:
            status = "timeout"
            error = (f"timeout: the OpenHands driver ran past its {run.time_limit_s:.0f} s (the task timeout less "
                     "a margin) and its process group was killed" + (f"; {finished.unread}" if finished.unread else ""))
        elif result.exit_code == 0 and converted.ended is not None:
            status = converted.ended
        elif result.exit_code == RUN_FAILED and converted.error is not None:
            status = "model_error" if converted.error_kind == "model" else "agent_error"
            error = f"{status}: the OpenHands conversation failed: {converted.error}"
        else:
            status = "agent_error"
            error = f"agent_error: the OpenHands driver exited with code {result.exit_code}"
        return Ending(exit_status=status, partial=result.timed_out or status == "agent_error", notes=error,
                      error=f"{error}; stderr tail:\n{tail}" if error is not None and tail else error)


def _inside(home: str, workdir: str) -> bool:
    """Whether HOME is unset, the workdir, or under it."""
    home, workdir = home.rstrip("/"), workdir.rstrip("/")
    return not home or home == workdir or home.startswith(workdir + "/")
