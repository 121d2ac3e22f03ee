"""Graders: turn what an agent left behind into an `Outcome`.

- SWE tests (`SWETestsGrader`): in a FRESH sandbox made from the task's environment (the base repository),
  apply the agent's patch, then the task's test patch, run FAIL_TO_PASS + PASS_TO_PASS and read each test's
  outcome. The agent's sandbox is never trusted with grading: tests it edited or files it left do not count.
  A patch that does not apply is a failed attempt, not an error. When the tests did not run at all (the
  runner could not start, timed out, printed no result), the same tests are run once more in another fresh
  sandbox WITHOUT the agent's patch (the control run): if they run there, the agent's patch broke them — a
  failed attempt; if they fail there too, the grading environment is broken and a GraderError is raised —
  never counted against the agent (a gold patch was once graded "failed" that way).
- Script (`ScriptGrader`): run the script in the agent's own sandbox after it finished. Without a
  `reward_file` it is resolved when it exits 0 (reward 1.0, else 0.0); with one, the reward is the number in
  that file, in [0, 1], and the rollout is resolved when the reward is at least the run's pass threshold (a
  partial score: 0.6 of the checks passed resolves a task only where the suite passes at 0.6). A script that
  cannot be started (exit 126/127) is a GraderError. The grader's `files` (a verifier's tests) are placed
  first. The reward file holds a number, or JSON: a number or an object with a numeric "reward" (Harbor's
  reward.json). With `reward_required` (the task dialects' verifiers, which always write a reward), a missing
  or unreadable reward is a GraderError naming the task and the file: the verifier broke, not the agent.

A sandbox that fails while grading raises (an OrchardError): the runner records that as a grader error."""

from __future__ import annotations

import json
import math
import posixpath
import shlex
from typing import Optional, Sequence

from orchard.core.errors import GraderError, InvalidRequest
from orchard.core.sandbox import Sandbox, SandboxFactory
from orchard.core.task import ScriptGrader, SWETestsGrader, Task
from orchard.core.trajectory import Outcome
from orchard.eval import swe_tests
from orchard.eval.task_sandbox import create_task_sandbox

GRADER_PYTHON = "python"  # resolved on the sandbox's PATH (Orchard's own Python first in the host image)
REWARD_FILE_MAX_BYTES = 1024


def sandbox_runner(sandbox: Sandbox) -> swe_tests.CommandRunner:
    """A CommandRunner that runs each command in `sandbox`."""

    async def run(argv: Sequence[str], cwd: str, stdin: Optional[str], timeout: float) -> swe_tests.CommandOutput:
        result = await sandbox.exec(list(argv), cwd=cwd, stdin=stdin, timeout=timeout)
        return swe_tests.CommandOutput(None if result.timed_out else result.exit_code, result.stdout, result.stderr)

    return run


async def grade_swe_patch(orch: SandboxFactory, task: Task, patch: str, *, labels: dict[str, str] | None = None,
                          label: str = "agent's patch", sandbox_ttl_s: float | None = None) -> Outcome:
    """Grade `patch` for a SWE task in a fresh sandbox, which is deleted afterwards. `sandbox_ttl_s`: that
    sandbox's TTL (default the spec's), which must outlast the grading."""
    grader = task.grader
    if not isinstance(grader, SWETestsGrader):
        raise InvalidRequest(f"task {task.id} has no SWE tests grader (its grader is "
                             f"{type(grader).__name__ if grader else 'none'})")
    run = await _run_in_fresh_sandbox(orch, task, patch, label, labels, sandbox_ttl_s)
    details = {"grader": "swe_tests", "tests": run.outcomes, "tests_exit_code": run.exit_code,
               "fail_to_pass": grader.fail_to_pass, "pass_to_pass": grader.pass_to_pass,
               "log_tail": run.log_tail}
    if run.infrastructure_error:
        if not patch.strip():
            raise GraderError(f"task {task.id}: {run.infrastructure_error}")
        control = await _run_in_fresh_sandbox(orch, task, "", "control run (no patch)", labels, sandbox_ttl_s)
        if control.infrastructure_error:
            raise GraderError(f"task {task.id}: the tests do not run in the grading environment, even without the "
                              f"{label}: {control.infrastructure_error}")
        details["tests_did_not_run"] = (f"{run.infrastructure_error} — they do run without the {label}, so the "
                                        "patch broke them")
    if run.error:
        details["patch_error"] = run.error
    resolved = swe_tests.is_resolved(grader.fail_to_pass, grader.pass_to_pass, run)
    return Outcome(resolved=resolved, reward=1.0 if resolved else 0.0, details=details)


async def _run_in_fresh_sandbox(orch: SandboxFactory, task: Task, patch: str, label: str,
                                labels: dict[str, str] | None, ttl_s: float | None) -> swe_tests.RunOutcome:
    grader = task.grader
    assert isinstance(grader, SWETestsGrader)
    sandbox = await create_task_sandbox(orch, task, labels=labels, **({"timeout_s": ttl_s} if ttl_s else {}))
    try:
        run = await swe_tests.evaluate_patch(
            sandbox_runner(sandbox), task.environment.workdir, patch, test_patch=grader.test_patch,
            fail_to_pass=grader.fail_to_pass, pass_to_pass=grader.pass_to_pass, python=GRADER_PYTHON,
            label=label, timeout=grader.timeout_s,
            test_command=shlex.split(grader.test_command) if grader.test_command else None)
    finally:
        await sandbox.close()
    return run


async def grade_script(sandbox: Sandbox, task: Task, *, pass_threshold: float = 1.0) -> Outcome:
    """Run a ScriptGrader's script in the agent's sandbox (where the agent's work is). With a reward file,
    resolved = reward ≥ `pass_threshold`."""
    grader = task.grader
    if not isinstance(grader, ScriptGrader):
        raise InvalidRequest(f"task {task.id} has no script grader")
    workdir = task.environment.workdir
    for file in grader.files:
        path = file.path if posixpath.isabs(file.path) else posixpath.join(workdir, file.path)
        await sandbox.write_file(path, file.data(), mode=file.mode)
    result = await sandbox.exec(grader.script, cwd=workdir, timeout=grader.timeout_s)
    if result.exit_code in (126, 127):
        raise GraderError(f"task {task.id}: the grader script could not be started (exit {result.exit_code}): "
                          f"{result.output.strip()[-300:]}")
    resolved = result.exit_code == 0 and not result.timed_out
    details = {"grader": "script", "exit_code": result.exit_code, "timed_out": result.timed_out,
               "output_tail": result.output[-swe_tests.LOG_TAIL_CHARS:]}
    reward = 1.0 if resolved else 0.0
    if grader.reward_file is not None:
        reward, details["reward_file"] = await _read_reward(sandbox, grader.reward_file)
        if grader.reward_required and details["reward_file"] != "read":
            raise GraderError(f"task {task.id}: the verifier's reward file {grader.reward_file} is "
                              f"{details['reward_file']} (the verifier exited {result.exit_code}"
                              f"{', timed out' if result.timed_out else ''}; its output ends: "
                              f"{_one_line(result.output)[-300:]})")
        resolved = reward >= pass_threshold
        details["pass_threshold"] = pass_threshold
    return Outcome(resolved=resolved, reward=reward, details=details)


async def _read_reward(sandbox: Sandbox, path: str) -> tuple[float, str]:
    """The number in the reward file; 0.0 (and why) when it is missing or not a number: the agent's work
    did not produce a reward, which is a failed attempt, not an error."""
    probe = await sandbox.exec(["head", "-c", str(REWARD_FILE_MAX_BYTES), path], timeout=30)
    if probe.exit_code != 0:
        return 0.0, f"missing: {probe.stderr.strip()[:200]}"
    text = probe.stdout.strip()
    reward = _reward_of(text)
    if reward is None:
        return 0.0, f"not a number: {text[:80]!r}"
    if not 0.0 <= reward <= 1.0:  # NaN included
        return 0.0, f"not a reward in [0, 1]: {text[:80]!r}"
    return reward, "read"


def _reward_of(text: str) -> float | None:
    """A plain number, or JSON: a number or an object whose "reward" is one (Harbor's reward.json)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _one_line(text: str) -> str:
    return " ".join(text.split())
