"""OpenHands as an Orchard harness: the OpenHands SDK's own agent (its default coding tools) runs *inside* the
sandbox from the `openhands` harness bundle, through a small driver of ours (driver.py) run by the bundle's
Python; its model is the run's gateway, reached at the rollout's own URL with the rollout's own key.

Each run: the driver and its config are written under STATE_DIR (outside the task's workdir, so the patch
never picks them up), the driver runs the conversation to its end under a timeout a margin short of the
evaluator's deadline (`sandbox.exec` kills the driver's whole process group when it passes; the margin,
orchard/harnesses/deadline.py, is what the kill and the reading of the events take on a busy machine), then
the conversation's persisted events are copied out and converted (convert.py) into the Trajectory: OpenHands'
own tool names and arguments, the observations as the model was shown them, each agent step carrying the
response id its gateway record has. The events directory is listed in `extra["native_logs"]`, so the
evaluator keeps it beside the trajectory.

A driver that crashes, hangs past its timeout, or whose model calls fail ends the rollout as an error
(`Outcome(error=...)` with the driver's stderr tail), never as a failed attempt. Once the adapter's own kill
fired, the rollout is the agent's `timeout` even when its events cannot be read before the deadline (or the
sandbox fails the reading): the error says so, and the steps are the ones read, if any."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.harness import ModelConfig, orchard_version
from orchard.core.run_status import ExitStatus
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Outcome, Trajectory
from orchard.harnesses.deadline import after_stop, run_limit_s
from orchard.harnesses.openhands.bundle import SDK_VERSION, SPEC
from orchard.harnesses.openhands.convert import ConvertedRun, convert_events

DRIVER_SOURCE = Path(__file__).with_name("driver.py")
STATE_DIR = "/tmp/.orchard-openhands"  # driver, config, the SDK's persisted conversation; outside every workdir
DRIVER_PATH = f"{STATE_DIR}/driver.py"
HOME_DIR = f"{STATE_DIR}/home"  # the agent's HOME where the sandbox's is the workdir (see run)
RUN_FAILED = 3  # the driver's exit code when the conversation itself failed (driver.py)
STDERR_TAIL_CHARS = 2000
DRIVER_ENV = {"LOG_LEVEL": "WARNING", "LOG_RICH_TRACEBACKS": "false", "PYTHONUNBUFFERED": "1",
              "NO_COLOR": "1", "TERM": "dumb"}


class OpenHandsHarness:
    name = "openhands"
    # The adapter's version with the SDK's as a local label: a change of either changes the resume key.
    version = f"{orchard_version()}+openhands-sdk.{SDK_VERSION}"
    bundle = SPEC.name

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

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        """The trial's harness-setup phase: the driver placed under STATE_DIR (a failure is a harness_error)."""
        made = await sandbox.exec(["mkdir", "-p", HOME_DIR])
        if not made.ok:
            raise InvalidRequest(f"openhands: cannot make {HOME_DIR} in the sandbox (the driver and the "
                                 f"conversation's events go there): {made.output.strip()[-500:]}")
        await sandbox.write_file(DRIVER_PATH, DRIVER_SOURCE.read_bytes())

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        workdir = task.environment.workdir
        conversation_id = uuid.uuid4()
        persistence_dir = f"{STATE_DIR}/conversations"
        events_dir = f"{persistence_dir}/{conversation_id.hex}/events"
        config = {
            "model": f"openai/{model.model}",  # litellm's OpenAI-compatible provider, at the gateway's URL
            "base_url": model.base_url, "workdir": workdir, "instruction": task.instruction,
            "state_dir": STATE_DIR, "persistence_dir": persistence_dir, "conversation_id": str(conversation_id),
            "max_iterations": self.step_limit, "num_retries": self.model_retries,
            "retry_wait_s": self.retry_wait_s, "request_timeout_s": int(model.timeout_s),
            "sampling": model.sampling.model_dump(exclude_none=True), "reasoning_effort": self.reasoning_effort,
        }
        await sandbox.write_file(f"{STATE_DIR}/config.json", json.dumps(config).encode(), mode=0o600)
        home = await sandbox.exec(["sh", "-c", 'printf %s "$HOME"'])
        env = {**SPEC.entry_env(), **DRIVER_ENV}
        if _inside(home.stdout.strip(), workdir):
            # The agent's shell writes its history (and the SDK its profiles) under HOME: not into the task's
            # repository, where the patch would pick them up. A HOME elsewhere is the task's and kept.
            env["HOME"] = HOME_DIR
        if model.api_key is not None:
            env["ORCHARD_OPENHANDS_API_KEY"] = model.api_key.get_secret_value()
        timeout = run_limit_s(model, self.timeout_s)
        result = await sandbox.exec(SPEC.entry_argv(DRIVER_PATH, f"{STATE_DIR}/config.json"),
                                    cwd=workdir, env=env, timeout=timeout)
        unread = None
        if result.timed_out:  # our own kill fired: the agent's timeout, whatever the reading meets
            read, unread = await after_stop(model, lambda: self._read_run(sandbox, events_dir))
            converted = read if read is not None else convert_events([], [], None)
        else:
            converted = await self._read_run(sandbox, events_dir)
        trajectory = converted.trajectory(agent_name=self.name, agent_version=self.version, model=model.model,
                                          task_id=task.id, rollout_key=model.rollout_key)
        trajectory.extra["native_logs"] = converted.native_logs
        self._settle(trajectory, result, converted, timeout, unread)
        return trajectory

    async def _read_run(self, sandbox: Sandbox, events_dir: str) -> ConvertedRun:
        """The conversation's events, the observation texts and the driver's result, as far as they exist."""
        with tempfile.TemporaryDirectory(prefix="orchard-openhands-") as tmp:
            local = Path(tmp)
            events: list[dict[str, Any]] = []
            try:
                await sandbox.download(events_dir, local / "events")
            except NotFound:  # the driver died before the conversation started
                pass
            for path in sorted((local / "events").glob("event-*.json")):
                events.append(json.loads(path.read_text()))
            observations = await _read_jsonl(sandbox, f"{STATE_DIR}/observations.jsonl")
            result = await _read_json(sandbox, f"{STATE_DIR}/result.json")
        converted = convert_events(events, observations, result)
        # what exists of the SDK's events and the driver's own files, kept beside the trajectory
        converted.native_logs = [path for path, there in ((events_dir, bool(events)),
                                                          (f"{STATE_DIR}/observations.jsonl", bool(observations)),
                                                          (f"{STATE_DIR}/result.json", result is not None)) if there]
        return converted

    @staticmethod
    def _settle(trajectory: Trajectory, result: ExecResult, converted: ConvertedRun, timeout: float | None,
                unread: str | None = None) -> None:
        """exit_status and, for a failure, Outcome(error=...) with the driver's stderr tail; `unread`: why the
        events of a driver killed at its timeout could not be read."""
        tail = _tail(result.stderr or result.stdout)
        status: ExitStatus
        error: str | None = None
        if result.timed_out:
            status = "timeout"
            error = (f"timeout: the OpenHands driver ran past its {timeout:.0f} s (the task timeout less a margin) "
                     "and its process group was killed" + (f"; {unread}" if unread else ""))
        elif result.exit_code == 0 and converted.ended is not None:
            status = converted.ended
        elif result.exit_code == RUN_FAILED and converted.error is not None:
            status = "model_error" if converted.error_kind == "model" else "agent_error"
            error = f"{status}: the OpenHands conversation failed: {converted.error}"
        else:
            status = "agent_error"
            error = f"agent_error: the OpenHands driver exited with code {result.exit_code}"
        trajectory.exit_status = status
        trajectory.partial = result.timed_out or status == "agent_error"  # cut off: its events as far as they go
        if error is not None:
            trajectory.outcome = Outcome(error=f"{error}; stderr tail:\n{tail}" if tail else error)
            trajectory.notes = error


async def _read_json(sandbox: Sandbox, path: str) -> dict[str, Any] | None:
    try:
        data = json.loads(await sandbox.read_file(path))
    except (NotFound, ValueError):  # absent (the driver died first): nothing to say
        return None
    return data if isinstance(data, dict) else None


async def _read_jsonl(sandbox: Sandbox, path: str) -> list[dict[str, Any]]:
    try:
        text = (await sandbox.read_file(path)).decode("utf-8", "replace")
    except NotFound:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # the last line of a killed driver
            continue
    return rows


def _inside(home: str, workdir: str) -> bool:
    """Whether HOME is unset, the workdir, or under it."""
    home, workdir = home.rstrip("/"), workdir.rstrip("/")
    return not home or home == workdir or home.startswith(workdir + "/")


def _tail(text: str) -> str:
    text = (text or "").strip()
    return text[-STDERR_TAIL_CHARS:]
