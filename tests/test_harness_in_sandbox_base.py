"""The in-sandbox adapters' one base (orchard/harnesses/in_sandbox/) on a real embedded sandbox, with a toy
adapter whose agent is a shell line (the real adapters' runs are in tests/test_harness_{kimi_cli,openhands,
cli}.py): the launch's files are placed (with their mode) before the command, which runs in the workdir with
its environment and stdin; the log is collected and converted; the ending is applied; a command killed at the
adapter's own limit is the agent's timeout, its log read after the kill."""

from __future__ import annotations

import pytest

from orchard.core.harness import ModelConfig
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.core.task import Task, TaskEnvironment
from orchard.core.trajectory import Step, Trajectory
from orchard.harnesses.in_sandbox import AgentRun, Ending, Finished, InSandboxHarness, Launch, SandboxFile
from orchard.harnesses.in_sandbox.native_log import read_jsonl
from orchard.sandbox.client import AsyncOrchard

STATE = "/tmp/.orchard-echo"
LOG = f"{STATE}/log.jsonl"
# The toy agent: logs its config file's mode, the instruction (stdin), its env and where it ran, then sleeps.
AGENT = ('printf \'{"mode": "%s", "said": "%s", "greeting": "%s", "cwd": "%s"}\\n\' '
         '"$(stat -c %a "$ECHO_CONFIG")" "$(cat)" "$GREETING" "$(pwd)" > "$ECHO_LOG"; sleep "$ECHO_SLEEP"')


class EchoHarness(InSandboxHarness):
    name = "echo"
    version = "0.1.0"
    bundle = "kimi-cli"  # only its spec is read: the toy agent is the image's own shell
    state_dir = STATE
    default_time_limit_s = 60.0

    def __init__(self, sleep_s: float = 0, timeout_s: float | None = None) -> None:
        self.sleep_s, self.timeout_s = sleep_s, timeout_s

    async def launch(self, run: AgentRun, sandbox: Sandbox) -> Launch:
        return Launch(argv=["sh", "-c", AGENT], stdin=run.task.instruction,
                      env={"ECHO_CONFIG": f"{STATE}/config", "ECHO_LOG": LOG, "GREETING": "hi",
                           "ECHO_SLEEP": str(self.sleep_s)},
                      files=[SandboxFile(path=f"{STATE}/config", data=b"secret", mode=0o600)])

    async def collect(self, run: AgentRun, sandbox: Sandbox, result: ExecResult) -> list[dict]:
        return await read_jsonl(sandbox, LOG)

    def convert(self, log: list[dict] | None, run: AgentRun, result: ExecResult) -> Trajectory:
        steps = [Step(step_id=i + 1, source="agent", message=row["said"], extra=row) for i, row in enumerate(log or [])]
        return Trajectory(agent=self.agent(run), steps=steps, extra={"native_logs": [LOG]})

    def ending(self, run: AgentRun, finished: Finished, log: list[dict] | None, trajectory: Trajectory) -> Ending:
        if finished.result.timed_out:
            return Ending(exit_status="timeout", error=f"killed after {run.time_limit_s:.0f} s", partial=True)
        return Ending(exit_status="submitted", notes="exit 0")


@pytest.fixture
async def sandbox(tmp_path):
    async with AsyncOrchard(home=tmp_path) as orch:
        box = await orch.create(image="host", workdir="/workspace")
        try:
            yield box
        finally:
            await box.close()


def _task() -> Task:
    return Task(id="t-1", instruction="say this", environment=TaskEnvironment(image="host", workdir="/workspace"))


async def test_a_run_places_its_files_runs_the_command_and_converts_its_log(sandbox):
    model = ModelConfig(model="m", rollout_key="run:t-1:1")
    trajectory = await EchoHarness().run(_task(), sandbox, model)
    (step,) = trajectory.steps
    assert step.message == "say this"
    assert {key: step.extra[key] for key in ("mode", "greeting", "cwd")} == {
        "mode": "600", "greeting": "hi", "cwd": "/workspace"}
    assert (trajectory.task_id, trajectory.rollout_key, trajectory.exit_status) == ("t-1", "run:t-1:1", "submitted")
    assert (trajectory.agent.name, trajectory.agent.model_name, trajectory.notes) == ("echo", "m", "exit 0")
    assert trajectory.outcome is None and not trajectory.partial


async def test_the_adapters_own_limit_kills_the_agent_and_its_log_is_still_read(sandbox):
    trajectory = await EchoHarness(sleep_s=60, timeout_s=2).run(_task(), sandbox, ModelConfig(model="m"))
    assert trajectory.exit_status == "timeout" and trajectory.partial
    assert trajectory.outcome.error == "killed after 2 s"
    assert [step.message for step in trajectory.steps] == ["say this"]  # written before the kill
