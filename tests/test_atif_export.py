"""ATIF exports are valid ATIF of the version they declare, checked by an independent validator written
from the spec (orchard/testing/atif_spec.py): the schema's own fixtures, and real trajectories of the react and
mini-swe-agent harnesses (run with the scripted model server, a stand-in for the model only, behind the
real gateway, in real sandboxes). `orchard export atif RUN_DIR OUT_DIR` writes them as files."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.atif import FIELDS_ADDED_IN, from_atif, to_atif
from orchard.core.errors import InvalidRequest
from orchard.core.jsonl import read_jsonl, write_jsonl
from orchard.core.trajectory import AtifObject, ContentPart, ImageSource, Step, Trajectory
from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.core.task_suite import TaskSuite
from orchard.eval.atif_export import atif_file_name, export_atif
from orchard.eval.runner import run_eval
from orchard.harnesses.mini_swe_agent import MiniSweAgentHarness
from orchard.harnesses.react import ReActHarness
from orchard.sandbox.client import AsyncOrchard
from tests.atif_spec import validate_atif
from tests.harness_rig import SCRIPTED, model_config, scripted_config, swe_mini_task, task_sandbox, tool_calls
from tests.test_harness_mini_swe_agent import SOLVING_SCRIPT as MINI_SCRIPT
from tests.test_harness_react import SOLVING_SCRIPT as REACT_SCRIPT
from tests.test_trajectory import rich_trajectory

TASK_ID = "orchard__pagekit-112"


def exported_and_valid(trajectory: Trajectory, **options) -> dict:
    document = json.loads(json.dumps(to_atif(trajectory, **options)))
    validate_atif(document)
    return document


def every_call_answered(document: dict) -> None:
    for step in document["steps"]:
        answered = {r.get("source_call_id") for r in (step.get("observation") or {}).get("results", [])}
        assert {call["tool_call_id"] for call in step.get("tool_calls", [])} <= answered, step["step_id"]


# --- the validator itself --------------------------------------------------------------------------

def test_the_validator_refuses_what_v16_does_not_have():
    good = {"schema_version": "ATIF-v1.6", "session_id": "s", "agent": {"name": "a", "version": "1"},
            "steps": [{"step_id": 1, "source": "agent", "message": "",
                       "tool_calls": [{"tool_call_id": "c", "function_name": "f", "arguments": {}}],
                       "observation": {"results": [{"source_call_id": "c", "content": "ok"}]}}]}
    validate_atif(good)
    step = good["steps"][0]
    bad = [
        {**good, "steps": [{**step, "tool_calls": [{**step["tool_calls"][0], "extra": {}}]}]},
        {**good, "steps": [{**step, "observation": {"results": [{"source_call_id": "c", "extra": {}}]}}]},
        {**good, "steps": [{**step, "llm_call_count": 1}]},
        {**good, "trajectory_id": "t"},
        {**good, "session_id": None},
        {**good, "steps": [{**step, "step_id": 2}]},
        {**good, "steps": [{**step, "observation": {"results": [{"source_call_id": "other"}]}}]},
        {**good, "steps": [{"step_id": 1, "source": "user", "message": "", "model_name": "m"}]},
    ]
    for document in bad:
        with pytest.raises(ValidationError):
            validate_atif(document)
    validate_atif({**good, "schema_version": "ATIF-v1.7", "session_id": None, "trajectory_id": "t",
                   "steps": [{**step, "llm_call_count": 1, "tool_calls": [{**step["tool_calls"][0], "extra": {}}]}]})


def test_the_validator_is_as_strict_as_the_schema_on_steps_and_numbers():
    """ATIF's schema: `steps` has minItems 1 (at every version, embedded subagents too); JSON numbers are
    finite."""
    agent = {"name": "a", "version": "1"}
    step = {"step_id": 1, "source": "agent", "message": "hi"}
    v16 = {"schema_version": "ATIF-v1.6", "session_id": "s", "agent": agent, "steps": [step]}
    v17 = {"schema_version": "ATIF-v1.7", "agent": agent, "steps": [step]}
    validate_atif(v16), validate_atif(v17)
    not_atif = [
        {**v16, "steps": []},
        {**v17, "steps": []},
        {**v17, "subagent_trajectories": [{**v17, "trajectory_id": "sub", "steps": []}]},
        {**v16, "steps": [{**step, "metrics": {"logprobs": [float("nan")]}}]},
        {**v16, "steps": [{**step, "metrics": {"cost_usd": float("inf")}}]},
    ]
    for document in not_atif:
        with pytest.raises(ValidationError):
            validate_atif(document)
    validate_atif({**v17, "subagent_trajectories": [{**v17, "trajectory_id": "sub"}]})


def test_a_trajectory_without_steps_exports_one_system_step_that_says_why():
    broken = Trajectory(agent={"name": "react", "version": "1"}, task_id="t", exit_status="environment_error",
                        outcome={"error": "environment setup failed: `make` exited 2"})
    for version in (None, "ATIF-v1.7"):
        document = exported_and_valid(broken, version=version)
        (step,) = document["steps"]
        assert (step["step_id"], step["source"]) == (1, "system")
        assert "recorded no steps" in step["message"] and "environment_error" in step["message"]
        assert "`make` exited 2" in step["message"]
        assert document["extra"]["orchard"]["stand_in_step"] is True
        assert from_atif(document).steps == []  # the stand-in is not a step of the rollout
    assert from_atif(to_atif(broken)) == broken
    # an embedded subagent that recorded nothing: the same, inside the document
    parent = Trajectory(schema_version="ATIF-v1.7", agent={"name": "a", "version": "1"},
                        steps=[Step(step_id=1, source="user", message="go")],
                        subagent_trajectories=[Trajectory(schema_version="ATIF-v1.7", trajectory_id="sub",
                                                          agent={"name": "b", "version": "1"})])
    document = exported_and_valid(parent)
    assert document["subagent_trajectories"][0]["steps"][0]["source"] == "system"
    assert from_atif(document) == parent


def test_the_version_table_covers_every_atif_field_of_the_schema():
    """A new ATIF field in trajectory.py must be given its version here, or exports would not place it."""
    for cls in FIELDS_ADDED_IN:
        atif_fields = set(cls.model_fields) - cls.ORCHARD_FIELDS
        assert atif_fields == set(FIELDS_ADDED_IN[cls]), cls.__name__
    models = {cls for cls in vars(__import__("orchard.core.trajectory", fromlist=["x"])).values()
              if isinstance(cls, type) and issubclass(cls, AtifObject) and cls.__module__ == "orchard.core.trajectory"}
    assert models - {cls for cls in models if cls.__name__ in ("AtifObject", "ExtensibleAtifObject")} == set(
        FIELDS_ADDED_IN)


# --- exports of the schema's fixtures --------------------------------------------------------------

def test_schema_fixtures_export_as_valid_atif_at_v16_and_v17():
    rich = rich_trajectory()
    document = exported_and_valid(rich)
    assert document["schema_version"] == "ATIF-v1.6" and from_atif(document) == rich
    subs = [sub.model_copy(update={"schema_version": "ATIF-v1.7"}) for sub in rich.subagent_trajectories]
    v17 = rich.model_copy(update={"schema_version": "ATIF-v1.7", "subagent_trajectories": subs})
    assert from_atif(exported_and_valid(v17)) == v17
    # written at another version than declared: valid there, the same trajectory but for the version
    assert from_atif(exported_and_valid(rich, version="ATIF-v1.7")) == rich.model_copy(update={
        "schema_version": "ATIF-v1.7", "subagent_trajectories": subs})


def test_fields_older_versions_lack_move_under_extra_and_come_back():
    step = Step(step_id=1, source="user", model_name="m", is_copied_context=True,
                message=[ContentPart(type="text", text="look: "),
                         ContentPart(type="image", source=ImageSource(media_type="image/png", path="a.png"))])
    trajectory = Trajectory(schema_version="ATIF-v1.4", session_id="s", steps=[step],
                            agent={"name": "a", "version": "1", "tool_definitions": [{"type": "function"}]})
    document = to_atif(trajectory)
    assert document["steps"][0]["message"] == "look: "  # v1.4 has no content parts: their text
    assert set(document["steps"][0]["extra"]["orchard"]) == {"message", "model_name", "is_copied_context"}
    assert document["agent"]["extra"]["orchard"]["tool_definitions"] == [{"type": "function"}]
    assert from_atif(document) == trajectory


def test_exports_that_the_version_cannot_hold_are_refused_with_the_reason():
    no_session = Trajectory(session_id=None, agent={"name": "a", "version": "1"})
    with pytest.raises(InvalidRequest, match="session_id is required before ATIF-v1.7"):
        to_atif(no_session)
    assert validate_atif(exported_and_valid(no_session, version="ATIF-v1.7"))
    ref_without_id = Trajectory(schema_version="ATIF-v1.7", agent={"name": "a", "version": "1"}, steps=[
        Step(step_id=1, source="agent", observation={"results": [{"subagent_trajectory_ref": [{"session_id": "s"}]}]})])
    with pytest.raises(InvalidRequest, match="resolves subagent references by trajectory_id or trajectory_path"):
        to_atif(ref_without_id)
    assert from_atif(exported_and_valid(ref_without_id, version="ATIF-v1.6")).steps == ref_without_id.steps


# --- real harness trajectories ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("atif-home")


@pytest.fixture(scope="module")
def harness_trajectories(scripted, gateway, home):
    """Real rollouts: react and mini-swe-agent (tool calling) solving a swe-mini task, mini-swe-agent in text
    mode, and react with a malformed tool call."""
    runs = [(ReActHarness(), REACT_SCRIPT), (MiniSweAgentHarness(), MINI_SCRIPT),
            (MiniSweAgentHarness(mode="text"),
             [{"content": "THOUGHT: list.\n\n```mswea_bash_command\nls pagekit\n```"},
              {"content": "THOUGHT: done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"}]),
            (ReActHarness(), [{"tool_calls": [{"name": "bash", "arguments": '{"command": "ls", '}]},
                              tool_calls(("submit", {}))])]
    trajectories = []

    async def run_all() -> None:
        async with AsyncOrchard(home=home) as orch:
            for harness, script in runs:
                scripted.load(script)
                task = swe_mini_task(TASK_ID)
                model = model_config(gateway)
                async with task_sandbox(orch, task) as sandbox:
                    trajectory = await harness.run(task, sandbox, model)
                calls = gateway.end_rollout(model.rollout_key)
                # as the evaluator records it: the gateway's calls attached
                trajectories.append(trajectory.model_copy(update={"llm_calls": calls}))

    asyncio.run(run_all())
    return trajectories


async def test_real_harness_trajectories_export_as_valid_atif(harness_trajectories):
    react, mini, mini_text, malformed = harness_trajectories
    for trajectory in harness_trajectories:
        for version in (None, "ATIF-v1.7"):
            document = exported_and_valid(trajectory, version=version)
            every_call_answered(document)
        assert from_atif(exported_and_valid(trajectory)) == trajectory
    submit_step = next(s for s in reversed(to_atif(mini)["steps"]) if s.get("tool_calls"))
    assert submit_step["observation"]["results"][0]["source_call_id"] == submit_step["tool_calls"][0]["tool_call_id"]
    react_submit = next(s for s in reversed(to_atif(react)["steps"]) if s.get("tool_calls"))
    assert react_submit["tool_calls"][0]["function_name"] == "submit"
    assert react_submit["observation"]["results"][0]["content"] == "Submitted."
    bad_call = next(s for s in to_atif(malformed)["steps"] if s.get("tool_calls"))
    assert bad_call["tool_calls"][0]["arguments"] == {}
    assert bad_call["extra"]["orchard"]["nested"]["tool_calls[0]"]["raw_arguments"] == '{"command": "ls", '


# --- orchard export atif ---------------------------------------------------------------------------

async def test_an_environment_error_rollout_exports_as_valid_atif(sandbox_home, tmp_path, scripted):
    """A real run whose task's setup fails: the rollout has no steps, its export is still valid ATIF."""
    task = Task(id="setup-fails", instruction="Never seen: the setup fails first.",
                environment=TaskEnvironment(image="host", setup=["echo no repository here >&2; exit 3"]),
                grader=ScriptGrader(script="true"))
    run_dir = tmp_path / "run"
    async with AsyncOrchard(home=sandbox_home) as orchard:
        await run_eval(harness="react", model=SCRIPTED, suite=TaskSuite(name="broken", tasks=[task]),
                       out_dir=run_dir, gateway_config=scripted_config(scripted), orchard_client=orchard)
    (trajectory,) = read_jsonl(run_dir / "trajectories.jsonl")
    assert (trajectory.steps, trajectory.exit_status) == ([], "environment_error")
    for version in (None, "ATIF-v1.7"):
        (path,) = export_atif(run_dir, tmp_path / f"atif-{version}", version=version)
        document = json.loads(path.read_text())
        validate_atif(document)
        (step,) = document["steps"]
        assert step["source"] == "system" and "environment_error" in step["message"]
        assert trajectory.outcome.error in step["message"]
    assert from_atif(json.loads(path.read_text())).steps == []


def test_export_cli_writes_one_valid_file_per_trajectory(harness_trajectories, tmp_path):
    run_dir, out_dir = tmp_path / "run", tmp_path / "atif"
    twice = harness_trajectories + [harness_trajectories[0]]  # the same task and key again: a second name
    write_jsonl(run_dir / "trajectories.jsonl", twice)
    result = CliRunner().invoke(app, ["export", "atif", str(run_dir), str(out_dir)])
    assert result.exit_code == 0, result.output
    assert f"{len(twice)} ATIF file(s) written" in result.output
    files = sorted(out_dir.iterdir())
    assert len(files) == len(twice) and all(f.suffix == ".json" for f in files)
    names = {atif_file_name(t, i) for i, t in enumerate(harness_trajectories)}
    assert names <= {f.name for f in files} and any(f.name.endswith("-2.json") for f in files)
    for path in files:
        assert set(path.stem) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        document = json.loads(path.read_text())
        validate_atif(document)
        assert from_atif(document) in twice
    assert not [name for name in os.listdir(out_dir) if name.endswith(".tmp")]

    v17 = CliRunner().invoke(app, ["export", "atif", str(run_dir), str(tmp_path / "v17"), "--version", "ATIF-v1.7"])
    assert v17.exit_code == 0, v17.output
    assert {json.loads(p.read_text())["schema_version"] for p in (tmp_path / "v17").iterdir()} == {"ATIF-v1.7"}


def test_export_cli_explains_a_missing_or_invalid_run_dir(tmp_path):
    def export(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["export", "atif", *args])
        assert "Traceback" not in result.output and not isinstance(result.exception, (TypeError, KeyError))
        return result.exit_code, "".join(result.output.split())  # rich wraps lines, even mid-word

    def says(text: str) -> str:
        return "".join(text.split())

    code, output = export(str(tmp_path / "nope"), str(tmp_path / "out"))
    assert code == 1 and says("nope does not exist; give the --out directory of an `orchard eval` run") in output
    empty = tmp_path / "empty"
    empty.mkdir()
    code, output = export(str(empty), str(tmp_path / "out"))
    assert code == 1 and says("has no trajectories.jsonl") in output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "trajectories.jsonl").write_text('{"agent": {}}\n')
    code, output = export(str(broken), str(tmp_path / "out"))
    assert code == 1 and says("trajectories.jsonl:1: not a valid Trajectory") in output
    assert not (tmp_path / "out").exists()
    write_jsonl(broken / "trajectories.jsonl", [Trajectory(agent={"name": "a", "version": "1"})])
    code, output = export(str(broken), str(tmp_path / "out"), "--version", "v9")
    assert code == 1 and says("cannot write ATIF version 'v9'") in output
