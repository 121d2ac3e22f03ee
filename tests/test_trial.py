"""The evaluator's Trial, phase by phase, on real sandboxes, the real gateway and the scripted model server
(a stand-in for the model only): regression tests for results that were once skewed quietly — a committed
fix graded as an empty patch, grader failures counted as the agent's, steps thrown away on a timeout or a
kill, runs of another configuration merged, errors hidden behind exit code 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.eval.run_config import TrialTimeouts
from orchard.cli.main import app
from orchard.core.errors import GraderError
from orchard.core.jsonl import read_jsonl
from orchard.core.task import Task, TaskEnvironment
from orchard.core.trajectory import LLMCall, Trajectory
from orchard.eval.grading import grade_swe_patch
from orchard.eval.partial import CALLS_FILE
from orchard.eval.patch import extract_patch, snapshot_base
from orchard.eval.results import RESULTS_FILE, TRAJECTORIES_FILE
from orchard.eval.suites import load_suite
from orchard.eval.task_sandbox import create_task_sandbox
from orchard.gateway.config import GatewayConfig
from orchard.sandbox.client import AsyncOrchard
from tests.hang_guard import returns
from tests.harness_rig import SCRIPTED, SWE_MINI_DIR, ScriptedModel, scripted_config, tool_calls
from tests.running_server import remove_live_sandboxes

PAGEKIT, LOGSTAMP = "orchard__pagekit-112", "orchard__logstamp-57"
cli = CliRunner()


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


async def evaluate(home: Path, out: Path, scripted: ScriptedModel, tasks: list[str], **options):
    from orchard.eval.runner import run_eval

    async with AsyncOrchard(home=home) as orchard:
        return await run_eval(harness=options.pop("harness", "react"), model=SCRIPTED, suite=options.pop(
            "suite", "swe-mini"), out_dir=out, gateway_config=scripted_config(scripted), task_ids=tasks,
            orchard_client=orchard, **options)


def trajectories(out: Path) -> list[Trajectory]:
    return read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False)


def bash(command: str) -> dict:
    return tool_calls(("bash", {"command": command}))


SUBMIT = tool_calls(("submit", {}))
COMMIT = "git -c user.name=agent -c user.email=agent@localhost commit -qam fix"


# --- 1. the patch -------------------------------------------------------------------------------------

async def test_the_patch_holds_committed_ignored_and_binary_changes_but_not_setups_files(home):
    """Diffed against a snapshot taken after setup, not against HEAD: a commit, a file .gitignore hides
    and non-UTF-8 bytes are all part of the agent's work; a file the setup made (ignored) is not."""
    task = Task(id="patch-probe", instruction="-", environment=TaskEnvironment(
        workdir="/testbed", setup=["git init -q && printf 'a\\n' > a.txt && printf '*.log\\n' > .gitignore && "
                                   "git add -A && git -c user.name=o -c user.email=o@o commit -qm base && "
                                   "echo built > setup.log"]))
    async with AsyncOrchard(home=home) as orch:
        sandbox = await create_task_sandbox(orch, task)
        try:
            base = await snapshot_base(sandbox, "/testbed")
            assert await extract_patch(sandbox, "/testbed", base) == ""
            agent_work = (f"printf 'b\\n' >> a.txt && {COMMIT} && echo notes > agent.log && "
                          "printf '\\377\\376' > blob.bin && mkdir -p __pycache__ && echo x > __pycache__/m.pyc")
            assert (await sandbox.exec(agent_work, cwd="/testbed")).exit_code == 0
            patch = await extract_patch(sandbox, "/testbed", base)
            status = await sandbox.exec("git status --porcelain", cwd="/testbed")
        finally:
            await sandbox.close()
    assert "diff --git a/a.txt b/a.txt" in patch and "+b" in patch  # committed by the agent, still its work
    assert "diff --git a/agent.log b/agent.log" in patch  # hidden by .gitignore, still its work
    assert "diff --git a/blob.bin b/blob.bin" in patch and "GIT binary patch" in patch  # not UTF-8: binary
    assert "setup.log" not in patch and "__pycache__" not in patch
    assert "blob.bin" in status.stdout, "the agent's own repository must not be touched by taking the patch"


@pytest.mark.slow
async def test_an_agent_that_commits_its_fix_is_graded_resolved(home, tmp_path, scripted):
    gold = load_suite(SWE_MINI_DIR).get(PAGEKIT).grader.reference_patch
    scripted.load([bash(f"cat > /tmp/fix.patch <<'ORCHARD_EOF'\n{gold}ORCHARD_EOF\n"
                        f"git apply /tmp/fix.patch && {COMMIT} && git status --porcelain"), SUBMIT])
    results = await evaluate(home, tmp_path / "run", scripted, [PAGEKIT])
    (row,) = results.tasks
    assert (row.status, row.exit_status) == ("resolved", "submitted"), row.error
    (trajectory,) = trajectories(tmp_path / "run")
    assert [phase.name for phase in trajectory.phases] == ["environment", "harness_setup", "agent", "patch", "verify"]
    assert [phase.result for phase in trajectory.phases] == ["ok", "skipped", "ok", "ok", "ok"]


# --- 2. grader infrastructure failures are errors -------------------------------------------------------

def _task_with_test_command(command: str) -> Task:
    task = load_suite(SWE_MINI_DIR).get(PAGEKIT)
    return task.model_copy(update={"grader": task.grader.model_copy(update={"test_command": command})})


@pytest.mark.slow
async def test_tests_that_cannot_run_anywhere_are_a_grader_error_not_a_failed_gold_patch(home):
    task = _task_with_test_command("/nonexistent/python -m pytest")
    async with AsyncOrchard(home=home) as orch:
        with pytest.raises(GraderError, match="even without the gold patch.*could not be started"):
            await grade_swe_patch(orch, task, task.grader.reference_patch, label="gold patch")


@pytest.mark.slow
async def test_a_patch_that_stops_the_tests_from_running_is_the_agents_failure(home):
    """The control run (no patch) shows the tests run in this environment: the patch broke them."""
    task = load_suite(SWE_MINI_DIR).get(PAGEKIT)
    breaking = ("diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
                "@@ -0,0 +1,2 @@\n+import os\n+os._exit(3)\n")
    async with AsyncOrchard(home=home) as orch:
        outcome = await grade_swe_patch(orch, task, breaking)
    assert outcome.error is None and outcome.resolved is False
    assert "they do run without the agent's patch" in outcome.details["tests_did_not_run"]


@pytest.mark.slow
async def test_a_grader_failure_in_a_run_is_an_error_retried_on_resume(home, tmp_path, scripted):
    suite = load_suite(SWE_MINI_DIR)
    broken = suite.model_copy(update={"tasks": [_task_with_test_command("/nonexistent/python -m pytest")]})
    scripted.load([SUBMIT], loop=True)
    results = await evaluate(home, tmp_path / "run", scripted, [PAGEKIT], suite=broken)
    (row,) = results.tasks
    assert (row.status, row.exit_status) == ("error", "grader_error")
    assert results.summary.finished == 0 and results.summary.resolve_rate is None


# --- 4. partial trajectories on timeouts; checkpoints survive a kill ---------------------------------

async def test_a_timeout_keeps_the_steps_taken_so_far(home, tmp_path, scripted):
    scripted.load([bash("echo first-step"), bash("echo second-step"), {"content": "thinking...", "delay_s": 30}])
    results = await evaluate(home, tmp_path / "run", scripted, [PAGEKIT], timeouts=TrialTimeouts(agent_s=8))
    (row,) = results.tasks
    assert (row.status, row.exit_status, row.partial) == ("error", "timeout", True)
    (trajectory,) = trajectories(tmp_path / "run")
    agent_steps = [step for step in trajectory.steps if step.source == "agent"]
    assert [step.tool_calls[0].arguments["command"] for step in agent_steps] == ["echo first-step", "echo second-step"]
    assert "first-step" in agent_steps[0].observation.results[0].content
    assert agent_steps[1].observation is None  # its result was never sent: the turn in flight
    assert [step.llm_call_ids for step in agent_steps] == [[call.id] for call in trajectory.llm_calls[:2]]
    assert trajectory.phases[2].name == "agent" and trajectory.phases[2].result == "timeout"


@pytest.mark.slow
def test_kill_9_of_orchard_eval_loses_at_most_the_turn_in_flight_and_resumes_exactly(home, tmp_path, scripted):
    """A run killed mid-trial: re-running the same command records the interrupted rollout from its
    checkpointed calls (steps kept, flagged partial), never re-runs a scored task, and runs the rest."""
    out = tmp_path / "run"
    scripted.load([SUBMIT, bash("echo one"), bash("echo two"), bash("sleep 120")])
    command = [sys.executable, "-m", "orchard.cli.main", "eval", "--harness", "react", "--model", "openai/scripted",
               "--api-base", f"{scripted.url}/v1", "--api-key", "unused", "--suite", "swe-mini",
               "--tasks", f"{PAGEKIT},{LOGSTAMP}", "--parallel", "1", "--out", str(out)]
    env = {**os.environ, "ORCHARD_HOME": str(home)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # the first task scored (its line written), the second in flight with its three calls made
        while _lines(out / CALLS_FILE) < 4 or _lines(out / TRAJECTORIES_FILE) < 1:
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before the kill"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    remove_live_sandboxes(home)
    scripted.load([SUBMIT], loop=True)
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert len(scripted.requests()) == 1, "only the interrupted task may call the model again"
    recorded = trajectories(out)
    assert [(t.task_id, t.rollout_key.rsplit(":", 1)[1], t.exit_status) for t in recorded] == [
        (PAGEKIT, "1", "submitted"), (LOGSTAMP, "1", "interrupted"), (LOGSTAMP, "2", "submitted")]
    interrupted = recorded[1]
    assert interrupted.partial and interrupted.outcome.error.startswith("interrupted")
    commands = [step.tool_calls[0].arguments["command"] for step in interrupted.steps if step.source == "agent"]
    assert commands == ["echo one", "echo two", "sleep 120"]  # every completed model call is kept
    assert len(interrupted.llm_calls) == 3
    rows = json.loads((out / RESULTS_FILE).read_text())["tasks"]
    assert [(row["task_id"], row["attempt"], row["status"]) for row in rows] == [
        (PAGEKIT, 1, "failed"), (LOGSTAMP, 2, "failed")]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


# --- 8/9. the CLI: exit codes, clean errors, per-task problems confined ------------------------------

def _invoke(home: Path, scripted: ScriptedModel, *args: str):
    return cli.invoke(app, ["eval", "--harness", "react", "--model", "openai/scripted", "--api-base",
                            f"{scripted.url}/v1", "--api-key", "unused", "--parallel", "2", *args],
                      env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})


def test_the_cli_exits_non_zero_when_a_rollout_errored_unless_allowed(home, tmp_path, scripted):
    down = ["--api-base", "http://127.0.0.1:9/v1"]  # nothing listens: every model call fails
    result = cli.invoke(app, ["eval", "--harness", "react", "--model", "openai/down", *down, "--api-key", "x",
                              "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(tmp_path / "a")],
                        env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})
    assert result.exit_code == 1, result.output
    assert "ended in an error" in result.output and "model_error" in result.output
    allowed = cli.invoke(app, ["eval", "--harness", "react", "--model", "openai/down", *down, "--api-key", "x",
                               "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(tmp_path / "b"),
                               "--allow-errors"], env={"ORCHARD_HOME": str(home), "COLUMNS": "250"})
    assert allowed.exit_code == 0, allowed.output


def test_out_pointing_at_a_file_is_a_clean_error(home, tmp_path, scripted):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    result = _invoke(home, scripted, "--suite", "swe-mini", "--tasks", PAGEKIT, "--out", str(target))
    assert result.exit_code == 2 and "is a file" in result.output and "Traceback" not in result.output
    assert target.read_text() == "keep me"


@pytest.mark.slow
def test_a_task_with_a_missing_or_empty_repository_errs_alone(home, tmp_path, scripted):
    suite = tmp_path / "suite"
    shutil.copytree(SWE_MINI_DIR, suite)
    shutil.rmtree(suite / "repos" / PAGEKIT)
    shutil.rmtree(suite / "repos" / LOGSTAMP)
    (suite / "repos" / LOGSTAMP).mkdir()
    scripted.load([SUBMIT], loop=True)
    others = _invoke(home, scripted, "--suite", str(suite), "--tasks", "orchard__csvlite-23", "--out",
                     str(tmp_path / "others"))
    assert others.exit_code == 0, others.output  # a broken task that is not selected blocks nothing
    both = _invoke(home, scripted, "--suite", str(suite), "--tasks", f"{PAGEKIT},{LOGSTAMP},orchard__csvlite-23",
                   "--out", str(tmp_path / "both"))
    assert both.exit_code == 1
    rows = {row["task_id"]: row for row in json.loads((tmp_path / "both" / RESULTS_FILE).read_text())["tasks"]}
    assert rows["orchard__csvlite-23"]["status"] == "failed"
    assert rows[PAGEKIT]["exit_status"] == rows[LOGSTAMP]["exit_status"] == "environment_error"
    assert "does not exist" in rows[PAGEKIT]["error"] and "is empty" in rows[LOGSTAMP]["error"]
    assert f"{LOGSTAMP} [environment_error]" in both.output.replace("\n", " ")  # in full, not cut off


@pytest.mark.slow
async def test_results_say_the_runs_elapsed_time_and_share_the_trajectories_file_mode(home, tmp_path, scripted):
    scripted.load([SUBMIT], loop=True)
    started = time.monotonic()
    results = await evaluate(home, tmp_path / "run", scripted, [PAGEKIT, LOGSTAMP], parallel=2)
    elapsed = time.monotonic() - started
    assert 0 < results.summary.wall_time_s <= elapsed
    assert results.summary.task_time_s == pytest.approx(sum(row.wall_time_s for row in results.tasks))
    assert results.summary.by_exit_status == {"submitted": 2}
    modes = {stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) for name in (RESULTS_FILE, TRAJECTORIES_FILE)}
    assert len(modes) == 1, f"results.json and trajectories.jsonl differ in mode: {modes}"


def test_harness_list_shows_the_version_trajectories_record():
    from orchard.harnesses.mini_swe_agent.harness import MiniSweAgentHarness

    result = cli.invoke(app, ["harness", "list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and MiniSweAgentHarness.version in result.output


def test_rebuilt_steps_keep_the_arguments_as_the_model_wrote_them():
    """What a cut-off trajectory is rebuilt from: the gateway's records, nothing invented."""
    from orchard.core.trajectory import Agent
    from orchard.eval.partial import trajectory_from_calls

    def call(number: int, messages: list[dict], arguments: str) -> LLMCall:
        return LLMCall(id=f"c{number}", request_messages=messages, response={"choices": [{"message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"t{number}", "type": "function",
                            "function": {"name": "bash", "arguments": arguments}}]}}]})

    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    reply = {"role": "assistant", "tool_calls": [{"id": "t1"}]}
    second = [*first, reply, {"role": "tool", "tool_call_id": "t1", "content": "out-1"}]
    rebuilt = trajectory_from_calls([call(1, first, '{"command":  "ls"}'), call(2, second, '{"command": "ls')],
                                    Agent(name="h", version="1"))
    assert [step.source for step in rebuilt.steps] == ["system", "user", "agent", "agent"]
    assert rebuilt.steps[2].observation.results[0].content == "out-1"
    assert rebuilt.steps[2].tool_calls[0].raw_arguments == '{"command":  "ls"}'
    assert rebuilt.steps[3].tool_calls[0].raw_arguments == '{"command": "ls'  # malformed, kept as written
    assert rebuilt.partial and rebuilt.steps[3].observation is None


def test_the_evaluation_docs_name_real_commands_and_options():
    """docs/evaluation.md's command lines: each command exists and each option it shows is one it takes
    (the runs themselves are the tests above)."""
    import re
    import shlex

    doc = (SWE_MINI_DIR.parents[1] / "docs" / "evaluation.md").read_text()
    block = doc.split("```", 2)[1]
    for text in filter(str.strip, block.splitlines()):
        words = [w for w in shlex.split(text, comments=True) if w != "..."]
        command = words[1:words.index(next(w for w in words if w.startswith("-")))] if any(
            w.startswith("-") for w in words) else words[1:2]
        help_text = cli.invoke(app, [*command, "--help"], env={"COLUMNS": "300"}).output
        for option in (w for w in words if w.startswith("--")):
            assert re.search(rf"{re.escape(option)}\b", help_text), f"{text!r}: `orchard {' '.join(command)}` has no {option}"


# --- the harness setup phase and the trial's deadline ---------------------------------------------------

class _SetupHarness:
    """A harness with a setup phase: it leaves a marker in the sandbox, which `run` then reads back."""

    name, version = "setup-probe", "1"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def setup(self, task, sandbox) -> None:
        if self.fail:
            raise RuntimeError("the harness could not be installed")
        await sandbox.write_file("/tmp/installed", b"yes")

    async def run(self, task, sandbox, model):
        from orchard.core.trajectory import Agent

        marker = await sandbox.read_file("/tmp/installed")
        trajectory = Trajectory(agent=Agent(name=self.name, version=self.version), exit_status="submitted")
        trajectory.notes = marker.decode()
        return trajectory


async def _run_trial(home: Path, harness, task: Task, timeouts) -> Trajectory:
    import asyncio

    from orchard.eval.local_gateway import LocalGateway
    from orchard.eval.trial import Trial, TrialRig
    from orchard.core.harness import SamplingParams

    with LocalGateway(GatewayConfig()) as gateway:
        async with AsyncOrchard(home=home) as orch:
            rig = TrialRig(harness=harness, model="none", sampling=SamplingParams(), timeouts=timeouts, orch=orch,
                           gateway=gateway, agent_slots=asyncio.Semaphore(1), grading_slots=asyncio.Semaphore(1))
            return await Trial(rig, task, "probe:task:1", {}).run()


async def test_the_harness_setup_phase_runs_first_and_a_failing_one_is_a_harness_error(home):
    from orchard.core.task import ScriptGrader
    from orchard.eval.run_config import TrialTimeouts

    task = Task(id="setup-probe", instruction="-", grader=ScriptGrader(script="true"))
    done = await _run_trial(home, _SetupHarness(), task, TrialTimeouts())
    assert done.notes == "yes" and done.outcome.resolved and done.exit_status == "submitted"
    assert [(p.name, p.result) for p in done.phases] == [
        ("environment", "ok"), ("harness_setup", "ok"), ("agent", "ok"), ("verify", "ok")]
    failed = await _run_trial(home, _SetupHarness(fail=True), task, TrialTimeouts())
    assert failed.exit_status == "harness_error" and "could not be installed" in failed.outcome.error
    assert [(p.name, p.result) for p in failed.phases] == [("environment", "ok"), ("harness_setup", "error")]


async def test_no_trial_outlives_its_deadline(home):
    """One deadline covers every phase: a setup that would hang for ten minutes is cut at the trial's."""
    from orchard.core.task import ScriptGrader
    from orchard.eval.run_config import TrialTimeouts

    task = Task(id="slow-setup", instruction="-", environment=TaskEnvironment(setup=["sleep 600"]),
                grader=ScriptGrader(script="true"))
    trajectory = await returns(_run_trial(home, _SetupHarness(), task, TrialTimeouts(trial_s=3)),
                               "a trial whose setup outlives its deadline")
    assert trajectory.exit_status == "environment_error" and "ran past" in trajectory.outcome.error
    assert trajectory.phases[0].result == "timeout" and trajectory.phases[0].timeout_s == pytest.approx(3, abs=0.5)


class _BrokenHarness(_SetupHarness):
    """Returns a trajectory that does not hold together (built without validation, steps out of order)."""

    name = "broken-probe"

    async def run(self, task, sandbox, model):
        from orchard.core.trajectory import Agent, Step

        return Trajectory.model_construct(agent=Agent(name=self.name, version=self.version),
                                          steps=[Step(step_id=7, source="user", message="x")])


async def test_an_invalid_trajectory_from_a_harness_is_its_error_not_a_crash_of_the_run(home):
    from orchard.core.task import ScriptGrader
    from orchard.eval.run_config import TrialTimeouts

    task = Task(id="broken-probe", instruction="-", grader=ScriptGrader(script="true"))
    trajectory = await _run_trial(home, _BrokenHarness(), task, TrialTimeouts())
    assert trajectory.exit_status == "agent_error" and trajectory.partial
    assert "invalid trajectory" in trajectory.outcome.error and "step_id" in trajectory.outcome.error
