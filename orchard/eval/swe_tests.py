"""The SWE-bench grading steps: apply a candidate patch and the test patch to a repository, run the listed
tests with pytest, read each test's outcome, decide whether the task is resolved.

Every command goes through a `CommandRunner`, `(argv, cwd, stdin, timeout) -> CommandOutput` (a plain
function or a coroutine function), so the same steps drive a temporary directory on this machine
(`run_local`, used by eval/swe-mini/validate.py) and a sandbox (`orchard.eval.grading`)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
from typing import Awaitable, Callable, Dict, List, Optional, Sequence, Union

PASSED, FAILED, ERROR, SKIPPED, XFAILED, XPASSED, MISSING = (
    "passed", "failed", "error", "skipped", "xfailed", "xpassed", "missing")
# pytest's -rA summary words, and which outcome wins when a test reports twice (e.g. PASSED, then
# ERROR in teardown).
_SUMMARY_WORDS = {"PASSED": PASSED, "FAILED": FAILED, "ERROR": ERROR, "SKIPPED": SKIPPED,
                  "XFAIL": XFAILED, "XPASS": XPASSED}
_SEVERITY = {MISSING: 0, PASSED: 1, XPASSED: 2, XFAILED: 3, SKIPPED: 4, FAILED: 5, ERROR: 6}

DEFAULT_TEST_TIMEOUT_S = 120.0
GIT_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 4000


class PatchApplyError(RuntimeError):
    """`git apply` rejected a patch: it does not fit the repository it was applied to."""


class WorkdirError(RuntimeError):
    """The workdir could not be made a git repository: the grading environment is broken."""


@dataclasses.dataclass(frozen=True)
class CommandOutput:
    exit_code: Optional[int]  # None when the command was killed by its timeout
    stdout: str
    stderr: str


# (argv, cwd, stdin text or None, timeout seconds) -> CommandOutput, or an awaitable of one.
CommandRunner = Callable[[Sequence[str], str, Optional[str], float],
                         Union[CommandOutput, Awaitable[CommandOutput]]]


@dataclasses.dataclass
class RunOutcome:
    """What one run (one patch applied, then the test patch, then the tests) produced."""

    label: str
    outcomes: Dict[str, str]
    exit_code: Optional[int]
    log_tail: str
    error: str = ""  # set when the run could not happen at all (a patch did not apply)
    # Set when the tests did not run (the runner could not start, timed out, printed no result): the
    # verdict is unknown, whoever is to blame (see `orchard.eval.grading`).
    infrastructure_error: str = ""


def run_local(argv: Sequence[str], cwd: str, stdin: Optional[str], timeout: float) -> CommandOutput:
    """Run a command on this machine. No bytecode files, so a repository's content stays as it was."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run(list(argv), cwd=cwd, input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return CommandOutput(None, _text(exc.stdout), _text(exc.stderr))
    return CommandOutput(done.returncode, done.stdout, done.stderr)


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""  # type: ignore[return-value]


async def _call(run: CommandRunner, argv: Sequence[str], cwd: str, stdin: Optional[str],
                timeout: float) -> CommandOutput:
    result = run(argv, cwd, stdin, timeout)
    return await result if inspect.isawaitable(result) else result


async def init_workdir(run: CommandRunner, workdir: str) -> None:
    """Make `workdir` a git repository so `git apply` resolves paths against it and nothing above (on a
    repository that already is one, `git init` changes nothing)."""
    result = await _call(run, ["git", "init", "-q", "."], workdir, None, GIT_TIMEOUT_S)
    if result.exit_code != 0:
        raise WorkdirError("git init failed in %s: %s" % (
            workdir, (result.stderr or result.stdout).strip() or "timed out"))


async def apply_patch(run: CommandRunner, workdir: str, patch: str, label: str) -> None:
    """Apply a unified diff with `git apply` (read from stdin). An empty patch is a no-op."""
    if not patch.strip():
        return
    result = await _call(run, ["git", "apply", "--whitespace=nowarn", "-"], workdir, patch, GIT_TIMEOUT_S)
    if result.exit_code != 0:
        raise PatchApplyError("the %s does not apply: %s" % (label, (result.stderr or result.stdout).strip()))


def pytest_command(python: str, test_ids: Sequence[str]) -> List[str]:
    return [python, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--color=no", *test_ids]


def parse_test_outcomes(output: str, test_ids: Sequence[str]) -> Dict[str, str]:
    """Per-test outcome from pytest's `-rA` short summary ("PASSED id", "FAILED id - message", ...).
    Ids are matched exactly (they may contain spaces or " - "); a test that never reported is `missing`."""
    outcomes = {test_id: MISSING for test_id in test_ids}
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        outcome = _SUMMARY_WORDS.get(word)
        if outcome is None:
            continue
        for test_id in test_ids:
            if rest == test_id or rest.startswith(test_id + " - "):
                if _SEVERITY[outcome] > _SEVERITY[outcomes[test_id]]:
                    outcomes[test_id] = outcome
    return outcomes


async def run_tests(run: CommandRunner, workdir: str, test_ids: Sequence[str], python: str,
                    timeout: float = DEFAULT_TEST_TIMEOUT_S, command: Optional[Sequence[str]] = None) -> RunOutcome:
    """Run the tests (`command` + ids when given, else pytest with `python`) and read their outcomes."""
    argv = [*command, *test_ids] if command else pytest_command(python, test_ids)
    result = await _call(run, argv, workdir, None, timeout)
    output = result.stdout + result.stderr
    outcomes = parse_test_outcomes(output, test_ids)
    return RunOutcome(label="", outcomes=outcomes, exit_code=result.exit_code, log_tail=output[-LOG_TAIL_CHARS:],
                      infrastructure_error=tests_did_not_run(result, outcomes, timeout))


# pytest's closing line, e.g. "2 passed, 1 failed in 0.12s" or "no tests ran in 0.01s" (also "= ... =").
_PYTEST_CLOSING = re.compile(r"(\bno tests ran\b|\b\d+ (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b)"
                             r".* in [\d.]+s")


def tests_did_not_run(result: CommandOutput, outcomes: Dict[str, str], timeout: float) -> str:
    """Why the test command cannot be read as a verdict, or "" when it can: it timed out, its program
    could not be started (exit 126/127), or no listed test reported and the runner printed no result."""
    if result.exit_code is None:
        return "the test run timed out after %g s" % timeout
    if result.exit_code in (126, 127):
        return "the test command could not be started (exit %d): %s" % (
            result.exit_code, (result.stderr or result.stdout).strip()[-300:])
    output = result.stdout + result.stderr
    if all(outcome == MISSING for outcome in outcomes.values()) and not _PYTEST_CLOSING.search(output):
        return "the test run reported no result (exit %d): %s" % (result.exit_code, output.strip()[-300:])
    return ""


async def evaluate_patch(run: CommandRunner, workdir: str, patch: str, *, test_patch: str,
                         fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], python: str = "python",
                         label: str = "patch", timeout: float = DEFAULT_TEST_TIMEOUT_S,
                         test_command: Optional[Sequence[str]] = None) -> RunOutcome:
    """The grading step, SWE-bench order: apply the candidate patch, then the test patch, then run
    FAIL_TO_PASS + PASS_TO_PASS. `workdir` holds a fresh copy of the base repository."""
    test_ids = list(fail_to_pass) + list(pass_to_pass)
    try:
        await init_workdir(run, workdir)
    except WorkdirError as exc:
        return RunOutcome(label, {test_id: MISSING for test_id in test_ids}, None, "", infrastructure_error=str(exc))
    try:
        await apply_patch(run, workdir, patch, label)
        await apply_patch(run, workdir, test_patch, "test_patch")
    except PatchApplyError as exc:
        return RunOutcome(label, {test_id: MISSING for test_id in test_ids}, None, "", error=str(exc))
    outcome = await run_tests(run, workdir, test_ids, python, timeout, test_command)
    outcome.label = label
    return outcome


def is_resolved(fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], run: RunOutcome) -> bool:
    """SWE-bench's verdict: every FAIL_TO_PASS and every PASS_TO_PASS test passed."""
    return not run.error and not run.infrastructure_error and all(run.outcomes.get(t) == PASSED for t in [*fail_to_pass, *pass_to_pass])
