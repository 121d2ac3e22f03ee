"""Check that every swe-mini task is a valid SWE-bench instance: with no fix its FAIL_TO_PASS tests fail
and its PASS_TO_PASS tests pass; with the gold patch all of them pass.

The grading steps (apply a diff, run the listed tests, read per-test outcomes) are Orchard's own
(`orchard.eval.swe_tests`): here they run in temporary copies on this machine, in `orchard eval validate`
and in the evaluator they run in sandboxes. Needs the `orchard` package importable (the project's venv).

    python validate.py                 # validate the whole suite next to this file
    python validate.py --only ID ...   # some tasks
    python validate.py --base-commit DIR   # print the base_commit hash of a repository directory
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from orchard.eval import swe_tests
from orchard.eval.swe_tests import (  # noqa: F401 — re-exported: this module's API for graders and tests
    DEFAULT_TEST_TIMEOUT_S,
    ERROR,
    FAILED,
    MISSING,
    PASSED,
    SKIPPED,
    XFAILED,
    XPASSED,
    CommandOutput,
    CommandRunner,
    PatchApplyError,
    RunOutcome,
    parse_test_outcomes,
    pytest_command,
    run_local,
)

SUITE_DIR = Path(__file__).resolve().parent
TASKS_FILE = "tasks.jsonl"
REPOS_DIR = "repos"

REQUIRED_FIELDS = (
    "instance_id", "repo", "base_commit", "version", "created_at", "problem_statement", "hints_text",
    "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
)
# Never part of a repository's content (and so never part of its base_commit).
IGNORED_NAMES = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache"})


class TaskFormatError(ValueError):
    """A task in tasks.jsonl is malformed (a field missing or of the wrong type)."""


@dataclasses.dataclass(frozen=True)
class SweInstance:
    instance_id: str
    repo: str
    base_commit: str
    version: str
    created_at: str
    problem_statement: str
    hints_text: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: List[str]
    PASS_TO_PASS: List[str]
    environment_setup_commit: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> "SweInstance":
        where = "task %r" % data.get("instance_id", "<no instance_id>")
        missing = [name for name in REQUIRED_FIELDS if name not in data]
        if missing:
            raise TaskFormatError("%s lacks the field(s) %s; every task needs %s"
                                  % (where, ", ".join(missing), ", ".join(REQUIRED_FIELDS)))
        values = {}
        for field in dataclasses.fields(cls):
            value = data.get(field.name, field.default)
            if field.name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
                if isinstance(value, str):  # SWE-bench on the Hub stores these lists as JSON text
                    value = json.loads(value)
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise TaskFormatError("%s: %s must be a list of pytest node ids" % (where, field.name))
            elif not isinstance(value, str):
                raise TaskFormatError("%s: field %s must be a string, got %s"
                                      % (where, field.name, type(value).__name__))
            values[field.name] = value
        return cls(**values)


@dataclasses.dataclass
class ValidationResult:
    instance_id: str
    problems: List[str]
    empty_run: Optional[RunOutcome]
    gold_run: Optional[RunOutcome]
    duration_s: float

    @property
    def valid(self) -> bool:
        return not self.problems


def load_instances(suite_dir: Path = SUITE_DIR) -> List[SweInstance]:
    path = Path(suite_dir) / TASKS_FILE
    if not path.is_file():
        raise TaskFormatError("no %s in %s: is this a swe-mini suite directory?" % (TASKS_FILE, suite_dir))
    instances = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFormatError("%s line %d is not JSON: %s" % (path, number, exc)) from None
        instances.append(SweInstance.from_dict(data))
    return instances


def repo_dir_for(instance: SweInstance, suite_dir: Path = SUITE_DIR) -> Path:
    return Path(suite_dir) / REPOS_DIR / instance.instance_id


def compute_base_commit(repo_dir: Path) -> str:
    """sha1 over the sorted files: for each, "<posix relative path>\\0<sha1 of its bytes>\\n"."""
    repo_dir = Path(repo_dir)
    entries = []
    for path in sorted(_repository_files(repo_dir)):
        digest = hashlib.sha1((repo_dir / path).read_bytes()).hexdigest()
        entries.append("%s\0%s\n" % (path, digest))
    return hashlib.sha1("".join(entries).encode("utf-8")).hexdigest()


def _repository_files(repo_dir: Path) -> Iterable[str]:
    for root, dirs, files in os.walk(repo_dir):
        dirs[:] = [d for d in dirs if d not in IGNORED_NAMES]
        for name in files:
            if not name.endswith(".pyc"):
                yield Path(root, name).relative_to(repo_dir).as_posix()


def evaluate_patch(run: CommandRunner, workdir: str, instance: SweInstance, patch: str, python: str,
                   label: str = "patch", timeout: float = DEFAULT_TEST_TIMEOUT_S) -> RunOutcome:
    """The grading step (see orchard.eval.swe_tests.evaluate_patch) for one instance of this suite."""
    return asyncio.run(swe_tests.evaluate_patch(
        run, workdir, patch, test_patch=instance.test_patch, fail_to_pass=instance.FAIL_TO_PASS,
        pass_to_pass=instance.PASS_TO_PASS, python=python, label=label, timeout=timeout))


def is_resolved(instance: SweInstance, run: RunOutcome) -> bool:
    """SWE-bench's verdict: every FAIL_TO_PASS and every PASS_TO_PASS test passed."""
    return swe_tests.is_resolved(instance.FAIL_TO_PASS, instance.PASS_TO_PASS, run)


def validate(instance: "SweInstance | dict", repo_dir: "Path | str", *, python: str = sys.executable,
             runner: CommandRunner = run_local, timeout: float = DEFAULT_TEST_TIMEOUT_S) -> ValidationResult:
    """Run the task twice on copies of `repo_dir` (empty patch, gold patch) and list what is wrong."""
    started = time.monotonic()
    if isinstance(instance, dict):
        instance = SweInstance.from_dict(instance)
    repo_dir = Path(repo_dir)
    problems = _static_problems(instance, repo_dir)
    runs: Dict[str, RunOutcome] = {}
    if not problems:
        for label, patch in (("empty patch", ""), ("gold patch", instance.patch)):
            runs[label] = _run_on_copy(runner, repo_dir, instance, patch, python, label, timeout)
        problems += _outcome_problems(instance, runs["empty patch"], runs["gold patch"])
    return ValidationResult(instance.instance_id, problems, runs.get("empty patch"), runs.get("gold patch"),
                            time.monotonic() - started)


def _static_problems(instance: SweInstance, repo_dir: Path) -> List[str]:
    if not repo_dir.is_dir():
        return ["repository directory %s does not exist" % repo_dir]
    problems = []
    actual = compute_base_commit(repo_dir)
    if actual != instance.base_commit:
        problems.append("base_commit is %s but the repository hashes to %s (files changed? recompute with "
                        "--base-commit)" % (instance.base_commit, actual))
    if not instance.FAIL_TO_PASS:
        problems.append("FAIL_TO_PASS is empty: the task tests nothing the fix changes")
    if len(instance.PASS_TO_PASS) < 2:
        problems.append("PASS_TO_PASS needs at least 2 tests, has %d" % len(instance.PASS_TO_PASS))
    overlap = set(instance.FAIL_TO_PASS) & set(instance.PASS_TO_PASS)
    if overlap:
        problems.append("tests in both FAIL_TO_PASS and PASS_TO_PASS: %s" % ", ".join(sorted(overlap)))
    if not instance.patch.strip():
        problems.append("the gold patch is empty")
    return problems


def _run_on_copy(run: CommandRunner, repo_dir: Path, instance: SweInstance, patch: str, python: str,
                 label: str, timeout: float) -> RunOutcome:
    workdir = tempfile.mkdtemp(prefix="swe-mini-")
    try:
        shutil.copytree(repo_dir, workdir, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(*IGNORED_NAMES, "*.pyc"))
        return evaluate_patch(run, workdir, instance, patch, python, label, timeout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _outcome_problems(instance: SweInstance, empty: RunOutcome, gold: RunOutcome) -> List[str]:
    problems = []
    for run in (empty, gold):
        if run.error:
            problems.append("%s: %s" % (run.label, run.error))
    if problems:
        return problems
    for test_id in instance.FAIL_TO_PASS:
        if empty.outcomes[test_id] == PASSED:
            problems.append("FAIL_TO_PASS %s already passes without the fix" % test_id)
        if gold.outcomes[test_id] != PASSED:
            problems.append("FAIL_TO_PASS %s is %s with the gold patch" % (test_id, gold.outcomes[test_id]))
    for test_id in instance.PASS_TO_PASS:
        for run in (empty, gold):
            if run.outcomes[test_id] != PASSED:
                problems.append("PASS_TO_PASS %s is %s with the %s" % (test_id, run.outcomes[test_id], run.label))
    if problems and all(outcome == MISSING for outcome in empty.outcomes.values()):
        problems.append("no test reported at all; pytest said:\n" + empty.log_tail[-1500:])
    return problems


def format_table(results: Sequence[ValidationResult]) -> str:
    width = max([len("instance_id")] + [len(r.instance_id) for r in results])
    lines = ["%-*s  %-7s  %-17s  %-17s  %6s" % (width, "instance_id", "status", "empty: f2p fail", "gold: all pass",
                                               "time")]
    for r in results:
        lines.append("%-*s  %-7s  %-17s  %-17s  %5.1fs" % (
            width, r.instance_id, "ok" if r.valid else "INVALID", _empty_summary(r), _gold_summary(r), r.duration_s))
    for r in results:
        for problem in r.problems:
            lines.append("%s: %s" % (r.instance_id, problem))
    return "\n".join(lines)


def _empty_summary(result: ValidationResult) -> str:
    run = result.empty_run
    if run is None or run.error:
        return "-"
    ids = list(run.outcomes)
    failing = sum(1 for t in ids if run.outcomes[t] != PASSED)
    return "%d/%d not passing" % (failing, len(ids))


def _gold_summary(result: ValidationResult) -> str:
    run = result.gold_run
    if run is None or run.error:
        return "-"
    passing = sum(1 for outcome in run.outcomes.values() if outcome == PASSED)
    return "%d/%d passing" % (passing, len(run.outcomes))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite-dir", type=Path, default=SUITE_DIR, help="directory holding tasks.jsonl and repos/")
    parser.add_argument("--only", nargs="+", metavar="INSTANCE_ID", help="validate only these tasks")
    parser.add_argument("--python", default=sys.executable, help="interpreter (with pytest) that runs the tests")
    parser.add_argument("--base-commit", type=Path, metavar="DIR", help="print the base_commit of DIR and exit")
    args = parser.parse_args(argv)
    if args.base_commit is not None:
        print(compute_base_commit(args.base_commit))
        return 0
    try:
        instances = load_instances(args.suite_dir)
    except TaskFormatError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    if args.only:
        unknown = sorted(set(args.only) - {i.instance_id for i in instances})
        if unknown:
            print("error: no task named %s in %s" % (", ".join(unknown), args.suite_dir), file=sys.stderr)
            return 2
        instances = [i for i in instances if i.instance_id in args.only]
    results = [validate(i, repo_dir_for(i, args.suite_dir), python=args.python) for i in instances]
    print(format_table(results))
    invalid = sum(1 for r in results if not r.valid)
    print("\n%d task(s), %d invalid" % (len(results), invalid))
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
