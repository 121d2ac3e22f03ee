"""Tasks, SWE-bench instances and task suites on disk."""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import ValidationError

from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.task import (
    ScriptGrader,
    SWEBenchInstance,
    SWETestsGrader,
    Task,
    TaskEnvironment,
    TaskFile,
)
from orchard.core.task_suite import TaskSuite

# A SWE-bench Verified row as the dataset's JSONL export has it: the test lists are JSON strings.
SWEBENCH_ROW = {
    "repo": "django/django",
    "instance_id": "django__django-11099",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "patch": "diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py\n-    regex = r'^[\\w.@+-]+$'\n+    regex = r'^[\\w.@+-]+\\Z'\n",
    "test_patch": "diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n+        invalid_usernames = ['trailingnewline\\n']\n",
    "problem_statement": "UsernameValidator allows trailing newline in usernames\nDescription\n...",
    "hints_text": "Consider \\A and \\Z.",
    "created_at": "2019-03-20T03:46:18Z",
    "version": "3.0",
    "FAIL_TO_PASS": "[\"test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)\", "
                    "\"test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)\"]",
    "PASS_TO_PASS": "[\"test_help_text (auth_tests.test_validators.MinimumLengthValidatorTest)\"]",
    "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
    "difficulty": "<15 min fix",
}


def test_swebench_json_string_lists_are_parsed():
    instance = SWEBenchInstance.model_validate(SWEBENCH_ROW)
    assert instance.FAIL_TO_PASS == ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",
                                     "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"]
    assert instance.PASS_TO_PASS == ["test_help_text (auth_tests.test_validators.MinimumLengthValidatorTest)"]
    assert instance.model_extra == {"difficulty": "<15 min fix"}  # variant fields are kept
    as_lists = SWEBenchInstance.model_validate({**SWEBENCH_ROW, "FAIL_TO_PASS": ["a"], "PASS_TO_PASS": []})
    assert as_lists.FAIL_TO_PASS == ["a"] and as_lists.PASS_TO_PASS == []


def test_swebench_malformed_test_list_is_refused_clearly():
    with pytest.raises(ValidationError, match="FAIL_TO_PASS is a string but not a JSON list"):
        SWEBenchInstance.model_validate({**SWEBENCH_ROW, "FAIL_TO_PASS": "test_a, test_b"})
    with pytest.raises(ValidationError, match="FAIL_TO_PASS"):
        SWEBenchInstance.model_validate({**SWEBENCH_ROW, "FAIL_TO_PASS": '{"not": "a list"}'})


def test_task_from_swebench():
    task = Task.from_swebench(SWEBENCH_ROW)
    assert task.id == "django__django-11099"
    assert task.instruction == SWEBENCH_ROW["problem_statement"]  # hints left out by default
    assert task.environment.image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert task.environment.workdir == "/testbed"
    grader = task.grader
    assert isinstance(grader, SWETestsGrader)
    assert grader.fail_to_pass[0].startswith("test_ascii_validator") and len(grader.pass_to_pass) == 1
    assert grader.test_patch == SWEBENCH_ROW["test_patch"] and grader.reference_patch == SWEBENCH_ROW["patch"]
    assert (grader.repo, grader.version) == ("django/django", "3.0")
    record = task.metadata["swebench"]
    assert record["base_commit"] == SWEBENCH_ROW["base_commit"] and record["difficulty"] == "<15 min fix"
    assert "patch" not in record and "test_patch" not in record  # the answers stay with the grader
    with_hints = Task.from_swebench(SWEBenchInstance.model_validate(SWEBENCH_ROW), include_hints=True,
                                    image="registry.local/django:3.0")
    assert with_hints.instruction.endswith("Hints:\nConsider \\A and \\Z.")
    assert with_hints.environment.image == "registry.local/django:3.0"


def test_task_json_round_trip_keeps_the_grader_kind():
    script_task = Task(id="hello", instruction="Write hello.txt",
                       environment=TaskEnvironment(files=[TaskFile(path="check.sh", content="test -f hello.txt\n",
                                                                   mode=0o755)],
                                                   setup=["git init -q"], env={"LANG": "C.UTF-8"}),
                       grader=ScriptGrader(script="sh check.sh", reward_file="/workspace/reward.txt"))
    for task in (script_task, Task.from_swebench(SWEBENCH_ROW)):
        assert Task.model_validate_json(task.model_dump_json()) == task
    assert isinstance(Task.model_validate_json(script_task.model_dump_json()).grader, ScriptGrader)


def test_task_validation():
    with pytest.raises(ValidationError, match="whitespace"):
        Task(id="two words", instruction="x")
    with pytest.raises(ValidationError, match="kind"):
        Task.model_validate({"id": "t", "instruction": "x", "grader": {"kind": "vibes"}})
    with pytest.raises(ValidationError, match="not valid base64"):
        TaskFile(path="blob.bin", content="***", encoding="base64")
    blob = TaskFile(path="blob.bin", content=base64.b64encode(b"\x00\xff").decode(), encoding="base64")
    assert blob.data() == b"\x00\xff"
    assert TaskFile(path="a.txt", content="é").data() == "é".encode()


def test_environment_gives_a_sandbox_spec():
    environment = TaskEnvironment(image="/images/debian", workdir="/testbed", env={"A": "1"})
    spec = environment.sandbox_spec(cpu=2, timeout_s=900)
    assert (spec.image, spec.workdir, spec.env, spec.cpu, spec.timeout_s) == ("/images/debian", "/testbed",
                                                                              {"A": "1"}, 2, 900)
    assert spec.network.mode == "none"


def test_suite_save_and_load(tmp_path):
    suite = TaskSuite(name="mini", description="two tasks",
                      tasks=[Task(id="a", instruction="do a"), Task.from_swebench(SWEBENCH_ROW)])
    suite.save(tmp_path / "mini")
    assert sorted(p.name for p in (tmp_path / "mini").iterdir()) == ["suite.json", "tasks.jsonl"]
    loaded = TaskSuite.load(tmp_path / "mini")
    assert loaded == suite
    assert loaded.get("a").instruction == "do a"
    with pytest.raises(NotFound, match="has no task 'zzz'.*a, django__django-11099"):
        loaded.get("zzz")


def test_suite_in_swebench_format_and_without_manifest(tmp_path):
    directory = tmp_path / "verified-mini"
    directory.mkdir()
    (directory / "tasks.jsonl").write_text(json.dumps(SWEBENCH_ROW) + "\n")
    with pytest.raises(InvalidRequest, match='look like SWE-bench instances: put {"format": "swebench"}'):
        TaskSuite.load(directory)  # no suite.json: the Orchard format
    (directory / "tasks.jsonl").write_text(Task(id="x", instruction="y").model_dump_json() + "\n")
    plain = TaskSuite.load(directory)
    assert plain.name == "verified-mini" and plain.tasks == [Task(id="x", instruction="y")]
    (directory / "tasks.jsonl").write_text(json.dumps(SWEBENCH_ROW) + "\n")
    (directory / "suite.json").write_text(json.dumps({"name": "verified-mini", "format": "swebench"}))
    suite = TaskSuite.load(directory)
    assert suite.tasks == [Task.from_swebench(SWEBENCH_ROW)]


def test_suite_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(NotFound, match="task suite directory .*nope does not exist"):
        TaskSuite.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequest, match="not a task suite: tasks.jsonl is missing"):
        TaskSuite.load(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tasks.jsonl").write_text('{"id": "a", "instruction": "x"}\n{"id": "b"}')
    with pytest.raises(InvalidRequest, match=r"tasks.jsonl:2: not a valid Task \(instruction: Field required"):
        TaskSuite.load(broken)
    (broken / "tasks.jsonl").write_text('{"id": "a", "instruction": "x"}\n{"id": "a", "instruction": "y"}\n')
    with pytest.raises(InvalidRequest, match="two tasks with id 'a'"):
        TaskSuite.load(broken)
    (broken / "suite.json").write_text('{"name": "b", "format": "csv"}')
    with pytest.raises(InvalidRequest, match="suite.json is not a valid suite manifest"):
        TaskSuite.load(broken)
