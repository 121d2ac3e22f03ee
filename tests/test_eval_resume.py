"""The evaluator stopped midway and resumed, and its sandboxes' lifetimes, on real parts: swe-mini tasks in real
embedded sandboxes, the react harness, the run's gateway in front of the scripted model server (the stand-in
for the model, which counts the calls it answers). A run is stopped the way Ctrl-C stops it (its task
cancelled), at a moment the test picks by holding the grader."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchard.core.jsonl import read_jsonl
from orchard.core.sandbox import SandboxSpec
from orchard.core.trajectory import Trajectory
from orchard.eval import trial as trial_module
from orchard.eval.checkpoint import CHECKPOINT_DIR
from orchard.eval.partial import CALLS_FILE
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.run_config import TrialTimeouts
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.sandbox.client import AsyncOrchard
from tests.harness_rig import SCRIPTED, SWE_MINI_DIR, ScriptedModel, scripted_config, tool_calls
from tests.running_server import live_sandbox_ids

PAGEKIT = "orchard__pagekit-112"
SUBMIT = tool_calls(("submit", {}))


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


def bash(command: str) -> dict:
    return tool_calls(("bash", {"command": command}))


async def evaluate(home: Path, out: Path, scripted: ScriptedModel, orch=None, **options):
    async with AsyncOrchard(home=home) as orchard:
        return await run_eval(harness="react", model=SCRIPTED, suite="swe-mini", out_dir=out,
                              gateway_config=scripted_config(scripted), task_ids=[PAGEKIT],
                              orchard_client=orch(orchard) if orch else orchard, **options)


def trajectories(out: Path) -> list[Trajectory]:
    path = out / TRAJECTORIES_FILE
    return read_jsonl(path, allow_interrupted_tail=False) if path.exists() else []


async def _stop_when(run: asyncio.Task, happened: asyncio.Event) -> None:
    """Stop the run as Ctrl-C does, once `happened` is set."""
    waiter = asyncio.ensure_future(happened.wait())
    await asyncio.wait([run, waiter], return_when=asyncio.FIRST_COMPLETED)
    assert not run.done(), f"the run ended before it was stopped: {run.result()}"
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


async def test_a_run_stopped_while_grading_grades_on_resume_without_running_the_agent_again(
        home, tmp_path, scripted, monkeypatch):
    gold = load_suite(SWE_MINI_DIR).get(PAGEKIT).grader.reference_patch
    scripted.load([bash(f"cat > /tmp/fix.patch <<'ORCHARD_EOF'\n{gold}ORCHARD_EOF\ngit apply /tmp/fix.patch"), SUBMIT])
    out = tmp_path / "run"
    grading = asyncio.Event()
    real_grader = trial_module.grade_swe_patch

    async def grader_stopped_midway(*args, **kwargs):
        grading.set()
        await asyncio.Event().wait()  # the run is stopped here, while the patch is graded

    monkeypatch.setattr(trial_module, "grade_swe_patch", grader_stopped_midway)
    await _stop_when(asyncio.create_task(evaluate(home, out, scripted)), grading)
    assert len(scripted.requests()) == 2
    assert trajectories(out) == [], "a rollout whose agent finished is not an interrupted one: it is graded"
    assert not await live_sandbox_ids(home)

    monkeypatch.setattr(trial_module, "grade_swe_patch", real_grader)
    scripted.load([SUBMIT], loop=True)  # (resets the count) any call now would submit an empty patch
    results = await evaluate(home, out, scripted)
    assert scripted.requests() == [], "the agent ran again on resume"
    (row,) = results.tasks
    assert (row.status, row.attempt, row.exit_status) == ("resolved", 1, "submitted"), row.error
    (trajectory,) = trajectories(out)
    assert trajectory.rollout_key.endswith(":1") and len(trajectory.llm_calls) == 2
    assert [phase.name for phase in trajectory.phases] == ["environment", "harness_setup", "agent", "patch", "verify"]
    assert all(phase.result in ("ok", "skipped") for phase in trajectory.phases)
    assert "git apply /tmp/fix.patch" in trajectory.steps[2].tool_calls[0].arguments["command"]
    assert not (out / CHECKPOINT_DIR).exists(), "the trial's checkpoint was left behind"


async def test_an_interrupted_rollout_keeps_the_phases_it_ran(home, tmp_path, scripted):
    scripted.load([bash("echo one"), {"content": "thinking...", "delay_s": 60}])
    out = tmp_path / "run"
    called = asyncio.Event()

    async def first_call_recorded() -> None:
        while not (out / CALLS_FILE).exists() or not (out / CALLS_FILE).read_bytes().count(b"\n"):
            await asyncio.sleep(0.1)
        called.set()

    watcher = asyncio.create_task(first_call_recorded())
    try:
        await _stop_when(asyncio.create_task(evaluate(home, out, scripted)), called)
    finally:
        watcher.cancel()
    (trajectory,) = trajectories(out)
    assert trajectory.exit_status == "interrupted" and trajectory.partial
    assert [(phase.name, phase.result) for phase in trajectory.phases] == [
        ("environment", "ok"), ("harness_setup", "skipped"), ("agent", "error")]
    assert trajectory.phases[2].error.startswith("interrupted")
    assert not (out / CHECKPOINT_DIR).exists()


class _RecordingFactory:
    """The real client, with every spec it is asked for kept (to read the TTLs a trial chose)."""

    def __init__(self, orch: AsyncOrchard) -> None:
        self.orch, self.specs = orch, []

    async def create(self, spec: SandboxSpec | None = None, **fields):
        self.specs.append(spec)
        return await self.orch.create(spec, **fields)


async def test_a_trial_longer_than_the_default_ttl_gets_sandboxes_that_outlive_it(home, tmp_path, scripted):
    scripted.load([SUBMIT])
    factories: list[_RecordingFactory] = []

    def recording(orch: AsyncOrchard) -> _RecordingFactory:
        factories.append(_RecordingFactory(orch))
        return factories[0]

    timeouts = TrialTimeouts(trial_s=6 * 3600, agent_s=5 * 3600, verify_s=2 * 3600)
    assert timeouts.trial_s > SandboxSpec().timeout_s and timeouts.verify_s > SandboxSpec().timeout_s
    results = await evaluate(home, tmp_path / "run", scripted, orch=recording, timeouts=timeouts)
    assert results.tasks[0].status == "failed", results.tasks[0].error
    agent_sandbox, grading_sandbox = factories[0].specs
    assert agent_sandbox.timeout_s >= timeouts.trial_s  # the trial's deadline, and a margin
    assert grading_sandbox.timeout_s >= timeouts.verify_s
