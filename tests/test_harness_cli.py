"""The zero-code `cli` harness end to end, on real parts: real harness bundles (the tiny test bundle's
Python 3.13; mini-swe-agent's own `mini` CLI), embedded local sandboxes, the run's own gateway in front of
the scripted model server (a stand-in for the model only) or the oracle policy.

The fast test is one run of four script tasks in parallel, one program dispatching on the task's
instruction: a small tool-calling agent whose steps the evaluator rebuilds from the gateway's records, a
crash, a hang past the harness's timeout, a program that never calls the model and one whose model call
fails (each an error). The
slow one runs `mini` through the `cli` harness on all of swe-mini with the oracle (the one test that runs the
whole suite through a harness end to end) and compares it with the dedicated in-process `mini-swe-agent`
adapter on ORACLE_SAMPLE (the oracle plays every task alike; those patches hold every awkward character): the
command is the one docs/harnesses.md shows (its `cli` block is checked here). A `k8s` test runs three
rollouts of the small agent in Pods."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from orchard.core.atif import to_atif
from orchard.core.errors import InvalidRequest
from orchard.core.harness import get_harness
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.jsonl import read_jsonl
from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.core.task_suite import TaskSuite
from orchard.core.trajectory import Trajectory
from orchard.eval.models import eval_gateway_config
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.gateway.config import GatewayConfig
from orchard.sandbox.harness_bundles.build import ensure_bundle
from orchard.cli.eval import _harness_options
from tests import doc_blocks
from tests.atif_spec import validate_atif
from tests.harness_bundle_rig import TINY, shared_downloads
from tests.harness_rig import ORACLE_SAMPLE, SCRIPTED, normalized, scripted_config
from tests.in_sandbox_harness_rig import k8s_run, unreachable_model
from tests.running_server import live_sandbox_ids
from tests.test_harness_bundles import bundle_home  # noqa: F401  (a fixture: the tiny bundle, built once)

ROOT = doc_blocks.ROOT
HANG_MARKER = "orchard-cli-test-hang"
# The program under test, run with the tiny bundle's Python; what it does follows the task's instruction.
AGENT = r'''
import json, os, subprocess, sys, time, urllib.request
what = sys.argv[1]
if what == "silent":
    print("nothing to do")
    sys.exit(0)
if what == "crash":
    raise SystemExit("cli-test: the agent crashed on purpose")
if what == "hang":
    subprocess.Popen(["sh", "-c", "sleep 600; : HANG_MARKER"])
    time.sleep(600)
if what == "broken":
    os.environ["OPENAI_MODEL"] = "down"  # a model the gateway serves from a port where nothing listens
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
def chat(messages):
    body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages, "tools": TOOLS}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, {
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["message"]
messages = [{"role": "system", "content": "You run commands."}, {"role": "user", "content": open(sys.argv[2]).read()}]
while True:
    message = chat(messages)
    messages.append(message)
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        output = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
'''.replace("HANG_MARKER", HANG_MARKER)
OPTIONS = {"bundle": TINY, "command": '{bundle}/venv/bin/python -c "$CLI_TEST_AGENT" {instruction} {instruction_file}',
           "env": {"CLI_TEST_AGENT": AGENT}, "timeout_s": 12}
SCRIPT = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo hello > hello.txt && cat hello.txt"}}],
           "content": "Writing the file."},
          {"content": "Done: hello.txt says hello."}]


@pytest.fixture
def home(monkeypatch, bundle_home):
    monkeypatch.setenv("ORCHARD_HOME", str(bundle_home))
    return bundle_home


def _task(instruction: str, grader: str = "true") -> Task:
    return Task(id=instruction, instruction=instruction, grader=ScriptGrader(script=grader),
                environment=TaskEnvironment(image="host", workdir="/workspace"))


def _trajectories(out: Path) -> dict[str, Trajectory]:
    return {t.task_id: t for t in read_jsonl(out / TRAJECTORIES_FILE, Trajectory, allow_interrupted_tail=False)}


async def test_bad_options_are_refused_before_anything_runs(tmp_path, home, scripted):
    for options, problem in [({"bundle": TINY}, "needs the command to run"),
                             ({"command": "my-agent"}, "needs a harness bundle to run from"),
                             ({"command": "my-agent --task {task_text}", "bundle": TINY},
                              r"unknown placeholder\(s\) \{task_text\}"),
                             ({"command": "my-agent", "bundle": TINY, "env": {"A": "{nope}"}}, r"env A names unknown"),
                             ({"command": "my-agent", "bundle": "no-such-bundle"}, "unknown harness bundle")]:
        with pytest.raises(InvalidRequest, match=problem):
            get_harness("cli", **options)
    # shell syntax is not a placeholder: ${VAR}, brace expansion and awk programs pass through
    get_harness("cli", bundle=TINY, command="echo ${HOME} {a,b} {1..3} | awk '{print $1}' {workdir}")
    with pytest.raises(InvalidRequest, match="unknown placeholder"):
        await run_eval(harness="cli", model=SCRIPTED, suite=TaskSuite(name="s", tasks=[_task("chat")]),
                       out_dir=tmp_path / "refused", gateway_config=scripted_config(scripted),
                       harness_options={"bundle": TINY, "command": "{instructions}"}, backend="local")
    assert not (tmp_path / "refused").exists()


async def test_steps_rebuilt_from_the_gateway_and_every_failure_an_error(tmp_path, home, scripted):
    scripted.load(SCRIPT)  # only the `chat` task calls the model
    suite = TaskSuite(name="cli-cases", tasks=[_task("chat", "grep -qx hello hello.txt"), _task("crash"),
                                               _task("hang"), _task("silent"), _task("broken")])
    out = tmp_path / "run"
    results = await run_eval(harness="cli", model=SCRIPTED, suite=suite, out_dir=out, parallel=5,
                             gateway_config=_with_a_dead_model(scripted_config(scripted)), harness_options=OPTIONS,
                             backend="local")
    rows = {row.task_id: row for row in results.tasks}
    trajectories = _trajectories(out)

    # the agent's steps are the gateway's records: text, tool calls, token ids; tool results from the next request
    chat = trajectories["chat"]
    assert (rows["chat"].status, chat.exit_status) == ("resolved", "submitted")
    assert [step.source for step in chat.steps] == ["system", "user", "agent", "agent"]
    assert chat.steps[1].message == "chat"  # the instruction, read from {instruction_file}
    agent_steps = [step for step in chat.steps if step.source == "agent"]
    assert [step.llm_call_ids for step in agent_steps] == [[call.id] for call in chat.llm_calls]
    for step, call in zip(agent_steps, chat.llm_calls):
        message = call.response["choices"][0]["message"]
        assert step.message == message["content"]
        assert [(c.tool_call_id, c.function_name, c.arguments) for c in step.tool_calls] == [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []]
        assert step.metrics.completion_token_ids == call.completion_token_ids
    (result,) = agent_steps[0].observation.results
    sent = chat.llm_calls[1].request_messages[-1]
    assert (result.source_call_id, result.content) == (sent["tool_call_id"], sent["content"]) and sent["content"] == "hello\n"
    assert chat.agent.tool_definitions == chat.llm_calls[0].request_params["tools"]  # what the program offered
    validate_atif(to_atif(chat))
    kept = chat.extra["native_logs"]
    assert set(kept) == {"/tmp/orchard-cli/stdout.log", "/tmp/orchard-cli/stderr.log"}
    assert (out / kept["/tmp/orchard-cli/stderr.log"]).read_text() == ""

    # failures are errors (not attempts), each with what the program said on stderr
    assert (rows["crash"].status, rows["crash"].exit_status) == ("error", "agent_error")
    assert rows["crash"].error.startswith("the program exited with code 1; stderr ends: cli-test: the agent crashed")
    assert (rows["hang"].status, rows["hang"].exit_status) == ("error", "timeout")
    assert "ran past its 12 s and was killed with its process group" in rows["hang"].error
    assert (rows["silent"].status, rows["silent"].exit_status) == ("error", "agent_error")
    assert rows["silent"].error == "the harness never called the model (exit code 0, nothing on stderr)"
    assert (rows["broken"].status, rows["broken"].exit_status) == ("error", "model_error")
    assert rows["broken"].error.startswith("the model call failed: ")
    assert "; the program exited with code 1; stderr ends: " in rows["broken"].error
    assert [call.error is not None for call in trajectories["broken"].llm_calls] == [True]
    assert results.summary.resolved == 1 and results.summary.errors == 4
    # nothing left running: no sandbox, not the hanging program's child
    assert not await live_sandbox_ids(home)
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and HANG_MARKER in _cmdline(pid)]


def _with_a_dead_model(config: GatewayConfig) -> GatewayConfig:
    return config.model_copy(update={"models": {**config.models, **unreachable_model("down").models}})


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


# --- mini-swe-agent's own `mini` CLI, with no adapter --------------------------------------------------------

DOC = ROOT / "docs" / "harnesses.md"


def documented_run() -> list[str]:
    """The `orchard eval --harness cli` line of docs/harnesses.md, split as the shell splits it."""
    (line,) = [text for _, code, _ in doc_blocks.of_kind(DOC, "cli") for text in code.splitlines()
               if text.startswith("orchard eval --harness cli")]
    return shlex.split(line)


def documented_options() -> dict[str, object]:
    """Its --harness-option values, as `orchard eval` reads them."""
    words = documented_run()
    return _harness_options([words[i + 1] for i, word in enumerate(words) if word == "--harness-option"])


def test_the_documented_command_parses_and_is_the_one_tested():
    doc_blocks.check_cli_lines(DOC)
    words = documented_run()
    assert words[words.index("--model") + 1] == "oracle" and words[words.index("--suite") + 1] == "swe-mini"
    options = documented_options()
    assert options["bundle"] == "mini-swe-agent" and options["native_logs"] == ["{scratch}/mini.traj.json"]
    get_harness("cli", **options)  # its placeholders are all known


@pytest.mark.slow
async def test_mini_cli_with_the_oracle_resolves_swe_mini_like_its_dedicated_adapter(tmp_path, home):
    ensure_bundle(get_bundle_spec("mini-swe-agent"), home / "cache", downloads=shared_downloads())
    config = eval_gateway_config("oracle")
    cli = await run_eval(harness="cli", model="oracle", suite="swe-mini", out_dir=tmp_path / "cli", parallel=4,
                         gateway_config=config, backend="local",
                         harness_options=documented_options())
    dedicated = await run_eval(harness="mini-swe-agent", model="oracle", suite="swe-mini", task_ids=ORACLE_SAMPLE,
                               out_dir=tmp_path / "mini", parallel=len(ORACLE_SAMPLE), gateway_config=config,
                               backend="local")
    assert cli.summary.resolved == len(cli.tasks) == 14
    assert dedicated.summary.resolved == len(dedicated.tasks) == len(ORACLE_SAMPLE)
    by_cli, by_adapter = _trajectories(tmp_path / "cli"), _trajectories(tmp_path / "mini")
    assert set(by_cli) == {task.task_id for task in cli.tasks} and set(by_adapter) == set(ORACLE_SAMPLE)
    for task_id, rebuilt in by_cli.items():
        validate_atif(to_atif(rebuilt))
        native = tmp_path / "cli" / rebuilt.extra["native_logs"]["/tmp/orchard-cli/mini.traj.json"]
        assert json.loads(native.read_text())["info"]["exit_status"] == "Submitted"
        assert len(rebuilt.llm_calls) == 3
        if task_id not in by_adapter:
            continue
        own = by_adapter[task_id]
        assert len(rebuilt.llm_calls) == len(own.llm_calls) == 3
        assert [s.source for s in rebuilt.steps] == [s.source for s in own.steps]
        assert _tool_calls(rebuilt) == _tool_calls(own)
        assert rebuilt.agent.tool_definitions == own.agent.tool_definitions  # mini's one bash tool
        # what the gateway cannot see: the result of the last tool call (mini's submission), never sent back
        assert _observations(rebuilt) == _observations(own)[:-1] + [[]]
        # the same conversation reached the model (its prompts, the instruction, every observation)
        assert [normalized(call.request_messages) for call in rebuilt.llm_calls] == [
            normalized(call.request_messages) for call in own.llm_calls]
    assert not await live_sandbox_ids(home)


def _tool_calls(trajectory: Trajectory) -> list[tuple[str, dict]]:
    return [(call.function_name, call.arguments) for step in trajectory.steps for call in step.tool_calls]


def _observations(trajectory: Trajectory) -> list[list[str]]:
    return [[result.content for result in (step.observation.results if step.observation else [])]
            for step in trajectory.steps if step.source == "agent"]



@pytest.mark.k8s
async def test_on_kubernetes_three_rollouts_rebuilt_from_the_gateway(tmp_path, home, monkeypatch, scripted):
    """The same harness in Pods of the dev cluster (an image without Python: the bundle brings its own),
    the bundle copied from its injector image, the run's gateway at the node's address. (swe-mini's tasks
    run on this machine's root, which Pods do not have.)"""
    from tests.k8s_cluster import NODE_IP

    with k8s_run(home, TINY) as config:
        monkeypatch.setenv("ORCHARD_GATEWAY_HOST", NODE_IP)
        scripted.load(SCRIPT, loop=True)  # one rollout at a time, so each gets the script from its start
        tasks = [Task(id=f"chat-{n}", instruction="chat", grader=ScriptGrader(script="grep -qx hello hello.txt"),
                      environment=TaskEnvironment(image="localhost/orchard-base:local", workdir="/workspace"))
                 for n in range(3)]
        out = tmp_path / "k8s"
        results = await run_eval(harness="cli", model=SCRIPTED, suite=TaskSuite(name="k8s-cli", tasks=tasks),
                                 out_dir=out, parallel=1, gateway_config=scripted_config(scripted),
                                 harness_options=OPTIONS, backend=config)
        assert [row.status for row in results.tasks] == ["resolved"] * 3, [row.error for row in results.tasks]
        for trajectory in _trajectories(out).values():
            assert [step.source for step in trajectory.steps] == ["system", "user", "agent", "agent"]
            assert trajectory.steps[2].observation.results[0].content == "hello\n"
            validate_atif(to_atif(trajectory))
