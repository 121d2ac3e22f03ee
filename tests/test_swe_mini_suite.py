"""The swe-mini SWE suite (eval/swe-mini): every task is well-formed, and valid when run for real — with no
fix its FAIL_TO_PASS tests fail, with the gold patch everything passes — through validate.py, using this
venv's python (which has pytest) to run each task's tests in a temporary copy of its repository."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SUITE_DIR = Path(__file__).resolve().parents[1] / "eval" / "swe-mini"


def _load_validate_module():
    # eval/swe-mini is not a package (the dash is deliberate: it is data with a script), so load by path.
    spec = importlib.util.spec_from_file_location("swe_mini_validate", SUITE_DIR / "validate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


V = _load_validate_module()
INSTANCES = V.load_instances(SUITE_DIR)
BY_ID = {instance.instance_id: instance for instance in INSTANCES}


def _raw_tasks() -> list[dict]:
    lines = (SUITE_DIR / "tasks.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _diff_paths(diff: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", diff, flags=re.MULTILINE)


def test_suite_has_at_least_12_tasks_with_unique_ids():
    ids = [task["instance_id"] for task in _raw_tasks()]
    assert len(ids) >= 12
    assert len(set(ids)) == len(ids)
    assert len({task["repo"] for task in _raw_tasks()}) == len(ids), "each task is its own project"


def test_every_task_has_every_field_with_the_right_type():
    for task in _raw_tasks():
        missing = [name for name in V.REQUIRED_FIELDS if name not in task]
        assert not missing, (task.get("instance_id"), missing)
        name = task["repo"].split("/", 1)[1]
        assert task["repo"] == "orchard/" + name
        assert re.fullmatch(r"orchard__%s-\d+" % re.escape(name), task["instance_id"])
        assert re.fullmatch(r"[0-9a-f]{40}", task["base_commit"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", task["created_at"])
        for field in ("version", "problem_statement", "patch", "test_patch"):
            assert isinstance(task[field], str) and task[field].strip(), (task["instance_id"], field)
        assert isinstance(task["hints_text"], str)
        assert isinstance(task["FAIL_TO_PASS"], list) and task["FAIL_TO_PASS"]
        assert isinstance(task["PASS_TO_PASS"], list) and len(task["PASS_TO_PASS"]) >= 2
        assert not set(task["FAIL_TO_PASS"]) & set(task["PASS_TO_PASS"])
        for test_id in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]:
            assert re.match(r"tests/test_\w+\.py::test_\w+", test_id), test_id


def test_repositories_are_small_and_hash_to_their_base_commit():
    for instance in INSTANCES:
        repo = V.repo_dir_for(instance, SUITE_DIR)
        files = sorted(V._repository_files(repo))
        assert 2 <= len(files) <= 6, (instance.instance_id, files)
        lines = sum(len((repo / f).read_text(encoding="utf-8").splitlines()) for f in files)
        assert lines < 300, (instance.instance_id, lines)
        assert any(f.startswith("tests/test_") for f in files)
        assert V.compute_base_commit(repo) == instance.base_commit


def test_gold_patch_leaves_tests_alone_and_test_patch_touches_only_tests():
    for instance in INSTANCES:
        assert _diff_paths(instance.patch), instance.instance_id
        assert not [p for p in _diff_paths(instance.patch) if p.startswith("tests/")], instance.instance_id
        assert all(p.startswith("tests/") for p in _diff_paths(instance.test_patch)), instance.instance_id


def test_outcome_parser_reads_the_short_summary_exactly():
    output = "\n".join([
        "..F",
        "=========================== short test summary info ============================",
        "PASSED tests/test_a.py::test_one",
        "PASSED tests/test_a.py::test_one_more",
        "FAILED tests/test_a.py::test_p[a - b] - AssertionError: assert 1 == 2",
        "PASSED tests/test_a.py::test_teardown",
        "ERROR tests/test_a.py::test_teardown - RuntimeError: teardown broke",
        "1 failed, 2 passed, 1 error in 0.03s",
    ])
    ids = ["tests/test_a.py::test_one", "tests/test_a.py::test_p[a - b]", "tests/test_a.py::test_teardown",
           "tests/test_a.py::test_never_ran"]
    assert V.parse_test_outcomes(output, ids) == {
        "tests/test_a.py::test_one": V.PASSED,  # not confused with test_one_more
        "tests/test_a.py::test_p[a - b]": V.FAILED,
        "tests/test_a.py::test_teardown": V.ERROR,  # a teardown error outranks the earlier PASSED
        "tests/test_a.py::test_never_ran": V.MISSING,
    }


def test_validation_flags_swapped_test_lists():
    instance = BY_ID["orchard__pagekit-112"]
    swapped = dataclasses.replace(instance, FAIL_TO_PASS=instance.PASS_TO_PASS, PASS_TO_PASS=instance.FAIL_TO_PASS)
    result = V.validate(swapped, V.repo_dir_for(instance, SUITE_DIR))
    assert not result.valid
    assert any("already passes without the fix" in p for p in result.problems)
    assert any("is failed with the empty patch" in p for p in result.problems)


def test_validation_flags_a_patch_that_does_not_apply():
    instance = BY_ID["orchard__pagekit-112"]
    foreign = dataclasses.replace(instance, patch=BY_ID["orchard__logstamp-57"].patch)
    result = V.validate(foreign, V.repo_dir_for(instance, SUITE_DIR))
    assert not result.valid
    assert any(p.startswith("gold patch: the gold patch does not apply") for p in result.problems)


def test_grading_steps_run_every_command_through_the_given_runner():
    commands = []

    def recording_runner(argv, cwd, stdin, timeout):
        commands.append(list(argv))
        return V.run_local(argv, cwd, stdin, timeout)

    instance = BY_ID["orchard__memocache-76"]
    result = V.validate(instance, V.repo_dir_for(instance, SUITE_DIR), runner=recording_runner)
    assert result.valid, V.format_table([result])
    assert V.is_resolved(instance, result.gold_run)
    assert not V.is_resolved(instance, result.empty_run)
    kinds = [" ".join(c[:2]) if c[0] == "git" else " ".join(c[1:3]) for c in commands]
    # empty run: init, test_patch, pytest; gold run: init, patch, test_patch, pytest
    assert kinds == ["git init", "git apply", "-m pytest", "git init", "git apply", "git apply", "-m pytest"]


def test_cli_exits_nonzero_when_a_task_is_invalid(tmp_path):
    instance = BY_ID["orchard__retrykit-15"]
    shutil.copytree(V.repo_dir_for(instance, SUITE_DIR), tmp_path / "repos" / instance.instance_id)
    broken = dict(dataclasses.asdict(instance), patch="")
    (tmp_path / "tasks.jsonl").write_text(json.dumps(broken) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(SUITE_DIR / "validate.py"), "--suite-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "INVALID" in done.stdout and "the gold patch is empty" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("instance_id", sorted(BY_ID))
def test_gold_patch_passes_and_empty_patch_fails(instance_id):
    instance = BY_ID[instance_id]
    result = V.validate(instance, V.repo_dir_for(instance, SUITE_DIR), python=sys.executable)
    assert result.valid, V.format_table([result])
    assert all(result.empty_run.outcomes[t] in (V.FAILED, V.ERROR) for t in instance.FAIL_TO_PASS)
    assert V.is_resolved(instance, result.gold_run)
