"""The trajectory schema, its ATIF and chat conversions, and the JSONL files trajectories are kept in."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import ValidationError

from orchard.core.atif import from_atif, to_atif
from orchard.core.chat import chat_tools, to_chat_messages, to_chat_sample
from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.jsonl import read_jsonl, write_jsonl
from orchard.core.sandbox import StartupTimings
from orchard.core.trajectory import (
    Agent,
    ContentPart,
    FinalMetrics,
    ImageSource,
    LLMCall,
    Metrics,
    Observation,
    ObservationResult,
    Outcome,
    Step,
    SubagentTrajectoryRef,
    ToolCall,
    Trajectory,
)
from tests.atif_spec import validate_atif

BASH_TOOL = {"type": "function", "function": {"name": "bash", "description": "run a command",
                                              "parameters": {"type": "object",
                                                             "properties": {"command": {"type": "string"}},
                                                             "required": ["command"]}}}


def rich_trajectory() -> Trajectory:
    """Every kind of field set, non-ASCII text, two tool calls in one step, token ids and logprobs."""
    calls = [
        LLMCall(id="c1", rollout_key="rk-7", model="qwen3-8b", request_messages=[{"role": "user", "content": "修复"}],
                request_params={"temperature": 0.7}, response={"choices": [{"index": 0}]},
                prompt_tokens=12, completion_tokens=3, cached_tokens=4, cost_usd=0.00012,
                prompt_token_ids=list(range(12)), completion_token_ids=[101, 102, 103],
                logprobs=[-0.25, -1.5e-05, -3.0], latency_s=0.84, started_at="2025-10-11T10:30:00Z"),
        LLMCall(id="c2", model="qwen3-8b", prompt_tokens=30, completion_tokens=5, completion_token_ids=[7, 8, 9, 10, 11],
                logprobs=[-0.1, -0.2, -0.3, -0.4, -0.5], latency_s=1.2, extra={"provider": "vllm"}),
        LLMCall(id="summary", model="qwen3-8b", prompt_tokens=50, completion_tokens=10, error=None),
    ]
    steps = [
        Step(step_id=1, source="system", message="You are a careful engineer. 🛠", is_copied_context=True),
        Step(step_id=2, source="user", message="Fix the bug in café.py — «quotes» and 日本語 too",
             timestamp="2025-10-11T10:29:59+00:00"),
        Step(step_id=3, source="agent", message="", reasoning_content="Look first, then grep.",
             model_name="qwen3-8b", reasoning_effort="high", timestamp="2025-10-11T10:30:00Z",
             tool_calls=[ToolCall(tool_call_id="call_a", function_name="bash", arguments={"command": "ls -la"}),
                         ToolCall(tool_call_id="call_b", function_name="bash",
                                  arguments={"command": "grep -rn 'naïve' .", "nested": {"k": [1, 2.5, None]}},
                                  extra={"parse": "strict"})],
             observation=Observation(results=[
                 ObservationResult(source_call_id="call_b", content="café.py:3: naïve = True"),
                 ObservationResult(source_call_id="call_a", content="total 8\n-rw-r--r-- café.py", extra={"exit": 0}),
             ]),
             metrics=Metrics(prompt_tokens=12, completion_tokens=3, cached_tokens=4, cost_usd=0.00012,
                             prompt_token_ids=list(range(12)), completion_token_ids=[101, 102, 103],
                             logprobs=[-0.25, -1.5e-05, -3.0], extra={"reasoning_tokens": 2}),
             llm_call_ids=["c1"], extra={"harness_step": "act"}),
        Step(step_id=4, source="agent", message=[ContentPart(type="text", text="Here is the screen:"),
                                                 ContentPart(type="image", source=ImageSource(
                                                     media_type="image/png", path="images/step4.png"))],
             observation=Observation(results=[
                 ObservationResult(content="feedback without a tool call"),
                 ObservationResult(content="summary", subagent_trajectory_ref=[
                     SubagentTrajectoryRef(trajectory_id="sub-1", session_id="s-sub")]),
             ]),
             llm_call_ids=["c2", "summary"], llm_call_count=2),
    ]
    sub = Trajectory(trajectory_id="sub-1", session_id=None, agent=Agent(name="helper", version="0.1"),
                     steps=[Step(step_id=1, source="user", message="sub task")])
    return Trajectory(
        session_id="run-42", agent=Agent(name="react", version="0.3.1", model_name="qwen3-8b",
                                         tool_definitions=[BASH_TOOL], extra={"prompt": "v2"}),
        steps=steps, notes="rich fixture", subagent_trajectories=[sub],
        final_metrics=FinalMetrics.from_llm_calls(
            calls, total_steps=4, wall_time_s=12.5, sandbox_cpu_s=3.25,
            sandbox_startup=StartupTimings(backend_create_ms=20.0, first_health_ms=1.5, total_ms=25.0)),
        task_id="django__django-11099", rollout_key="rk-7",
        outcome=Outcome(reward=1.0, resolved=True, details={"tests": {"passed": 3, "failed": 0}}),
        llm_calls=calls, extra={"dataset": "unit"})


def test_atif_export_then_import_is_lossless_through_json():
    trajectory = rich_trajectory()
    document = json.loads(json.dumps(to_atif(trajectory), ensure_ascii=False))
    validate_atif(document)
    assert from_atif(document) == trajectory
    assert from_atif(json.dumps(document)) == trajectory  # JSON text is accepted too


def test_atif_export_is_plain_atif_with_orchard_fields_under_extra():
    """The default declared version, ATIF-v1.6: what v1.6 lacks (tool-call and observation-result extras,
    llm_call_count, embedded subagents) is Orchard data under the nearest enclosing `extra`."""
    document = to_atif(rich_trajectory())
    validate_atif(document)
    assert set(document) == {"schema_version", "session_id", "agent", "steps", "notes", "final_metrics", "extra"}
    assert document["schema_version"] == "ATIF-v1.6"
    assert document["agent"]["name"] == "react" and document["agent"]["tool_definitions"] == [BASH_TOOL]
    orchard = document["extra"]["orchard"]
    assert orchard["task_id"] == "django__django-11099"
    assert orchard["outcome"]["resolved"] is True
    assert [call["id"] for call in orchard["llm_calls"]] == ["c1", "c2", "summary"]
    assert [sub["trajectory_id"] for sub in orchard["subagent_trajectories"]] == ["sub-1"]
    assert document["extra"]["dataset"] == "unit"
    final = document["final_metrics"]
    assert final["total_prompt_tokens"] == 92 and final["total_completion_tokens"] == 18
    assert final["extra"]["orchard"] == {"wall_time_s": 12.5, "sandbox_cpu_s": 3.25, "n_llm_calls": 3,
                                         "sandbox_startup": {"backend_create_ms": 20.0, "first_health_ms": 1.5,
                                                             "total_ms": 25.0}}
    step3 = document["steps"][2]
    assert step3["extra"] == {"harness_step": "act", "orchard": {
        "llm_call_ids": ["c1"],
        "nested": {"tool_calls[1]": {"extra": {"parse": "strict"}}, "observation.results[1]": {"extra": {"exit": 0}}}}}
    assert all(set(call) == {"tool_call_id", "function_name", "arguments"} for call in step3["tool_calls"])
    assert step3["metrics"]["completion_token_ids"] == [101, 102, 103]
    assert step3["tool_calls"][1]["arguments"]["nested"] == {"k": [1, 2.5, None]}
    assert document["steps"][3]["extra"] == {"orchard": {"llm_call_ids": ["c2", "summary"], "llm_call_count": 2}}
    # Defaults stay out of the document: no empty lists, no false flags, no nulls.
    assert "is_copied_context" not in step3 and "tool_calls" not in document["steps"][1]
    assert document["steps"][0]["is_copied_context"] is True
    atif_part = {**document, "extra": {**document["extra"], "orchard": {}}}
    assert "null" not in json.dumps(atif_part).replace("None", "").replace("[1, 2.5, null]", "")


def test_atif_v17_export_uses_v17_fields_where_they_are():
    rich = rich_trajectory()
    subs = [sub.model_copy(update={"schema_version": "ATIF-v1.7"}) for sub in rich.subagent_trajectories]
    trajectory = rich.model_copy(update={"schema_version": "ATIF-v1.7", "subagent_trajectories": subs})
    document = to_atif(trajectory)
    validate_atif(document)
    assert document["schema_version"] == "ATIF-v1.7"
    embedded = document["subagent_trajectories"][0]
    assert "session_id" not in embedded and embedded["trajectory_id"] == "sub-1"
    step3 = document["steps"][2]
    assert step3["extra"] == {"harness_step": "act", "orchard": {"llm_call_ids": ["c1"]}}
    assert step3["tool_calls"][1]["extra"] == {"parse": "strict"}
    assert step3["observation"]["results"][1]["extra"] == {"exit": 0}
    assert document["steps"][3]["llm_call_count"] == 2
    assert from_atif(json.loads(json.dumps(document))) == trajectory


def test_plain_atif_from_another_tool_imports():
    """The RFC's example document (ATIF-v1.4), with explicit nulls as some writers emit them."""
    document = {
        "schema_version": "ATIF-v1.4", "session_id": "025B810F-B3A2-4C67-93C0-FE7A142A947A",
        "agent": {"name": "harbor-agent", "version": "1.0.0", "model_name": "gemini-2.5-flash", "extra": {}},
        "notes": "Initial test trajectory", "extra": {},
        "final_metrics": {"total_prompt_tokens": 1120, "total_completion_tokens": 124, "total_cached_tokens": 200,
                          "total_cost_usd": 0.00078, "total_steps": 3, "extra": {}},
        "steps": [
            {"step_id": 1, "timestamp": "2025-10-11T10:30:00Z", "source": "user",
             "message": "What is the current trading price of Alphabet (GOOGL)?", "extra": {}},
            {"step_id": 2, "timestamp": "2025-10-11T10:30:02Z", "source": "agent", "model_name": "gemini-2.5-flash",
             "reasoning_effort": "medium", "message": "I will search.", "reasoning_content": "Two data points.",
             "tool_calls": [
                 {"tool_call_id": "call_price_1", "function_name": "financial_search",
                  "arguments": {"ticker": "GOOGL", "metric": "price"}},
                 {"tool_call_id": "call_volume_2", "function_name": "financial_search",
                  "arguments": {"ticker": "GOOGL", "metric": "volume"}}],
             "observation": {"results": [
                 {"source_call_id": "call_price_1", "content": "GOOGL is trading at $185.35"},
                 {"source_call_id": "call_volume_2", "content": "GOOGL volume: 1.5M shares"}]},
             "metrics": {"prompt_tokens": 520, "completion_tokens": 80, "cached_tokens": 200, "cost_usd": 0.00045}},
            {"step_id": 3, "timestamp": "2025-10-11T10:30:05Z", "source": "agent", "message": "$185.35",
             "reasoning_content": None, "tool_calls": None, "observation": None, "is_copied_context": None,
             "metrics": {"prompt_tokens": 600, "completion_tokens": 44, "completion_token_ids": [1722, 310],
                         "logprobs": [-0.1, -0.05], "cost_usd": 0.00033, "extra": {"reasoning_tokens": 12}}},
        ],
    }
    trajectory = from_atif(document)
    assert trajectory.session_id == "025B810F-B3A2-4C67-93C0-FE7A142A947A"
    assert trajectory.task_id is None and trajectory.outcome is None and trajectory.llm_calls == []
    assert trajectory.steps[1].tool_calls[1].arguments == {"ticker": "GOOGL", "metric": "volume"}
    assert trajectory.steps[2].metrics.extra == {"reasoning_tokens": 12}
    assert trajectory.final_metrics.total_cost_usd == 0.00078
    # Re-exported, it is the same document minus the nulls and empty extras, which ATIF treats as absent.
    again = to_atif(trajectory)
    assert again["steps"][1] == document["steps"][1]
    assert again["steps"][2] == {k: v for k, v in document["steps"][2].items() if v is not None}
    assert from_atif(again) == trajectory
    validate_atif(to_atif(trajectory, version="ATIF-v1.6"))  # the validator knows v1.6 and v1.7, not v1.4


def test_atif_v17_document_without_session_id_keeps_it_absent():
    document = {"schema_version": "ATIF-v1.7", "trajectory_id": "t1", "agent": {"name": "a", "version": "1"},
                "steps": [{"step_id": 1, "source": "user", "message": "hi", "llm_call_count": 0}]}
    trajectory = from_atif(document)
    assert trajectory.session_id is None
    assert to_atif(trajectory) == document
    validate_atif(to_atif(trajectory))


@pytest.mark.parametrize("document, expected", [
    ({"schema_version": "ATIF-v9.0", "session_id": "s", "agent": {"name": "a", "version": "1"}, "steps": []},
     "ATIF-v9.0"),
    ({"session_id": "s", "agent": {"name": "a", "version": "1"},
      "steps": [{"step_id": 1, "source": "user", "message": "m", "function_ancestry": {}}]}, "function_ancestry"),
    ({"session_id": "s", "agent": {"name": "a", "version": "1"}, "steps": [],
      "extra": {"orchard": {"teleport": 1}}}, "teleport"),
    ({"session_id": "s", "agent": {"name": "a", "version": "1"}, "steps": [], "extra": {"orchard": [1]}},
     "must be an object"),
    ([1, 2], "JSON object"),
    ("{not json", "not valid JSON"),
])
def test_invalid_atif_documents_are_refused_with_the_reason(document, expected):
    with pytest.raises(InvalidRequest, match=expected):
        from_atif(document)


def test_dangling_observation_reference_is_refused():
    with pytest.raises(ValidationError, match="references tool call 'call_x'"):
        Step(step_id=1, source="agent", tool_calls=[ToolCall(tool_call_id="call_a", function_name="bash")],
             observation=Observation(results=[ObservationResult(source_call_id="call_x", content="?")]))
    document = to_atif(rich_trajectory())
    document["steps"][2]["observation"]["results"][0]["source_call_id"] = "call_gone"
    with pytest.raises(InvalidRequest, match="call_gone"):
        from_atif(document)


def test_step_ids_must_run_in_order():
    agent = Agent(name="a", version="1")
    with pytest.raises(ValidationError, match="step_id must run 1, 2, 3"):
        Trajectory(agent=agent, steps=[Step(step_id=1, source="user"), Step(step_id=3, source="agent")])
    with pytest.raises(ValidationError, match="step_id must run 1, 2, 3"):
        Trajectory(agent=agent, steps=[Step(step_id=2, source="user"), Step(step_id=1, source="agent")])
    trajectory = Trajectory(agent=agent, steps=[Step(step_id=1, source="user")])
    assert trajectory.next_step_id == 2


def test_other_consistency_rules():
    agent = Agent(name="a", version="1")
    with pytest.raises(ValidationError, match="used twice"):
        Step(step_id=1, source="agent", tool_calls=[ToolCall(tool_call_id="x", function_name="f")] * 2)
    with pytest.raises(ValidationError, match="only agent steps make tool calls"):
        Step(step_id=1, source="user", tool_calls=[ToolCall(tool_call_id="x", function_name="f")])
    with pytest.raises(ValidationError, match="not in llm_calls"):
        Trajectory(agent=agent, steps=[Step(step_id=1, source="agent", llm_call_ids=["nope"])])
    with pytest.raises(ValidationError, match="reserved"):
        Step(step_id=1, source="user", extra={"orchard": 1})
    with pytest.raises(ValidationError, match="ISO 8601"):
        Step(step_id=1, source="user", timestamp="yesterday")
    with pytest.raises(ValidationError, match="cannot be resolved"):
        Outcome(resolved=True, error="sandbox lost")
    with pytest.raises(ValidationError, match="unique among its siblings"):
        Trajectory(agent=agent, subagent_trajectories=[Trajectory(agent=agent)])
    assert Outcome(error="model API 503").counts_as_attempt is False


def test_chat_messages_link_tool_calls_to_tool_messages():
    trajectory = rich_trajectory()
    messages = to_chat_messages(trajectory)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant", "user", "user"]
    assert messages[0]["content"].startswith("Fix the bug in café.py")
    assistant = messages[1]
    assert assistant["reasoning_content"] == "Look first, then grep."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_a", "call_b"]
    assert assistant["tool_calls"][1]["type"] == "function"
    assert json.loads(assistant["tool_calls"][1]["function"]["arguments"]) == {
        "command": "grep -rn 'naïve' .", "nested": {"k": [1, 2.5, None]}}
    assert "naïve" in assistant["tool_calls"][1]["function"]["arguments"]  # not \\u-escaped
    call_ids = {c["id"] for c in assistant["tool_calls"]}
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert {m["tool_call_id"] for m in tool_messages} == call_ids
    assert tool_messages[0] == {"role": "tool", "tool_call_id": "call_b", "content": "café.py:3: naïve = True"}
    assert messages[4]["content"] == [{"type": "text", "text": "Here is the screen:"},
                                      {"type": "image_url", "image_url": {"url": "images/step4.png"}}]
    assert "tool_calls" not in messages[4] and "reasoning_content" not in messages[4]
    assert messages[5] == {"role": "user", "content": "feedback without a tool call"}


def test_copied_context_steps_are_left_out_unless_asked_for():
    trajectory = rich_trajectory()
    assert all(m["role"] != "system" for m in to_chat_messages(trajectory))
    with_copied = to_chat_messages(trajectory, include_copied_context=True)
    assert with_copied[0] == {"role": "system", "content": "You are a careful engineer. 🛠"}
    assert with_copied[1:] == to_chat_messages(trajectory)


def test_chat_sample_carries_the_tools():
    sample = to_chat_sample(rich_trajectory())
    assert sample["tools"] == [BASH_TOOL] == chat_tools(rich_trajectory())
    assert sample["messages"] == to_chat_messages(rich_trajectory())


def test_final_metrics_from_llm_calls_totals_only_what_was_reported():
    metrics = FinalMetrics.from_llm_calls([LLMCall(id="a", prompt_tokens=5), LLMCall(id="b", prompt_tokens=7)])
    assert metrics.total_prompt_tokens == 12 and metrics.total_cost_usd is None and metrics.n_llm_calls == 2


def test_jsonl_write_is_atomic_and_reads_back(tmp_path):
    path = tmp_path / "runs" / "trajectories.jsonl"
    first = rich_trajectory()
    second = Trajectory(agent=Agent(name="b", version="2"), task_id="t2")
    write_jsonl(path, [first, second])
    assert read_jsonl(path) == [first, second]
    assert path.read_bytes().count(b"\n") == 2
    write_jsonl(path, [second])  # replaces the whole file
    assert read_jsonl(path) == [second]
    assert [p.name for p in path.parent.iterdir()] == ["trajectories.jsonl"]  # no temp file left behind


def test_jsonl_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "t.jsonl"
    old = Trajectory(agent=Agent(name="a", version="1"))
    write_jsonl(path, [old])

    def items():
        yield Trajectory(agent=Agent(name="new", version="1"))
        raise RuntimeError("producer failed midway")

    with pytest.raises(RuntimeError):
        write_jsonl(path, items())
    assert read_jsonl(path) == [old]
    assert os.listdir(tmp_path) == ["t.jsonl"]


def test_jsonl_append_resumes_after_an_interrupted_write(tmp_path):
    path = tmp_path / "results.jsonl"
    runs = [Trajectory(agent=Agent(name="a", version="1"), task_id=f"t{i}") for i in range(3)]
    write_jsonl(path, runs[:1], append=True)
    write_jsonl(path, runs[1:2], append=True)
    with open(path, "ab") as out:  # a crash in the middle of writing a line
        out.write(runs[2].model_dump_json().encode()[:40])
    assert read_jsonl(path) == runs[:2]
    with pytest.raises(InvalidRequest, match=r"results.jsonl:3: not a valid Trajectory"):
        read_jsonl(path, allow_interrupted_tail=False)
    write_jsonl(path, runs[2:], append=True)  # cuts the broken tail off first
    assert read_jsonl(path, allow_interrupted_tail=False) == runs


def test_jsonl_append_completes_a_valid_line_missing_its_newline(tmp_path):
    path = tmp_path / "hand-made.jsonl"
    runs = [Trajectory(agent=Agent(name="a", version="1"), task_id=f"t{i}") for i in range(2)]
    path.write_bytes(runs[0].model_dump_json().encode())
    write_jsonl(path, runs[1:], append=True)
    assert read_jsonl(path, allow_interrupted_tail=False) == runs


def test_jsonl_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(NotFound, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"agent": {"name": "a", "version": "1"}}\n{"agent": {}}\n')
    with pytest.raises(InvalidRequest, match=r"bad.jsonl:2: not a valid Trajectory \(agent.name: Field required"):
        read_jsonl(path)


# ATIF's field names per object (RFC 0001, v1.0-v1.7), written out here independently of Orchard's models.
ATIF_KEYS = {
    "trajectory": {"schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics",
                   "continued_trajectory_ref", "extra", "subagent_trajectories"},
    "agent": {"name", "version", "model_name", "tool_definitions", "extra"},
    "final_metrics": {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd",
                      "total_steps", "extra"},
    "step": {"step_id", "timestamp", "source", "model_name", "reasoning_effort", "message", "reasoning_content",
             "tool_calls", "observation", "metrics", "llm_call_count", "is_copied_context", "extra"},
    "tool_call": {"tool_call_id", "function_name", "arguments", "extra"},
    "observation": {"results"},
    "result": {"source_call_id", "content", "subagent_trajectory_ref", "extra"},
    "subagent_ref": {"session_id", "trajectory_id", "trajectory_path", "extra"},
    "metrics": {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "prompt_token_ids",
                "completion_token_ids", "logprobs", "extra"},
    "content_part": {"type", "text", "source"},
    "image_source": {"media_type", "path"},
}
ATIF_REQUIRED = {"trajectory": {"schema_version", "agent", "steps"}, "agent": {"name", "version"},
                 "step": {"step_id", "source", "message"},
                 "tool_call": {"tool_call_id", "function_name", "arguments"}, "observation": {"results"}}


def _check_atif_object(kind, obj, where):
    assert set(obj) <= ATIF_KEYS[kind], f"{where}: non-ATIF keys {set(obj) - ATIF_KEYS[kind]}"
    assert ATIF_REQUIRED.get(kind, set()) <= set(obj), f"{where}: missing {ATIF_REQUIRED[kind] - set(obj)}"
    children = {"trajectory": {"agent": "agent", "final_metrics": "final_metrics", "steps": "step",
                               "subagent_trajectories": "trajectory"},
                "step": {"tool_calls": "tool_call", "observation": "observation", "metrics": "metrics",
                         "message": "content_part"},
                "observation": {"results": "result"},
                "result": {"subagent_trajectory_ref": "subagent_ref", "content": "content_part"},
                "content_part": {"source": "image_source"}}.get(kind, {})
    for key, child in children.items():
        value = obj.get(key)
        for index, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, dict):
                _check_atif_object(child, item, f"{where}.{key}[{index}]")


def test_atif_export_uses_only_atif_fields():
    _check_atif_object("trajectory", to_atif(rich_trajectory()), "trajectory")
    validate_atif(to_atif(rich_trajectory()))  # and the independent validator of the declared version


def test_conversions_share_no_mutable_state_with_their_inputs():
    trajectory = rich_trajectory()
    document = to_atif(trajectory)
    document["steps"][2]["tool_calls"][1]["arguments"]["nested"]["k"].append("changed")
    assert trajectory.steps[2].tool_calls[1].arguments["nested"] == {"k": [1, 2.5, None]}
    imported = from_atif(to_atif(trajectory))
    document = to_atif(trajectory)
    again = from_atif(document)
    document["steps"][2]["tool_calls"][1]["arguments"]["nested"]["k"].append("changed")
    assert again == imported == trajectory


def test_the_python_example_in_docs_trajectory_runs(tmp_path, monkeypatch):
    """docs/trajectory.md's code block, run as written on a real trajectory (and an ATIF file from
    another tool beside it)."""
    import json
    import re
    from pathlib import Path

    from orchard.core.atif import to_atif

    doc = (Path(__file__).resolve().parents[1] / "docs" / "trajectory.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/trajectory.md lost its example"
    trajectory = rich_trajectory()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "harbor_run.json").write_text(json.dumps(to_atif(trajectory)))
    for block in blocks:
        exec(compile(block, "docs/trajectory.md", "exec"), {"trajectory": trajectory})
