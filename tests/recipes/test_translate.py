"""Cross-harness distillation on real parts: trajectories recorded by real runs of the evaluator (the react
and mini-swe-agent harnesses on swe-mini tasks, in real sandboxes, with the oracle policy or the scripted
model server as the model), translated to the other harness, then replayed by the target harness's own
tools in a fresh sandbox: the diff they leave must be the diff the source run left."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchard.core.actions import Create, Replace, View
from orchard.core.jsonl import read_jsonl
from orchard.eval.models import eval_gateway_config
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.recipes.translate.replay import replay_patch
from orchard.recipes.translate.trajectory import UntranslatableCall, translate_all, translate_trajectory
from orchard.sandbox.client import AsyncOrchard
from orchard.util.shell_forms import SUBMIT_COMMAND, shell_command
from tests.harness_rig import tool_calls

PAGEKIT, LOGSTAMP = "orchard__pagekit-112", "orchard__logstamp-57"
SCRIPTED = "scripted"


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


async def record(home: Path, out: Path, *, harness: str, model: str, config: GatewayConfig, tasks: list[str]):
    async with AsyncOrchard(home=home) as orchard:
        await run_eval(harness=harness, model=model, suite="swe-mini", out_dir=out, gateway_config=config,
                       task_ids=tasks, orchard_client=orchard, parallel=2)
    return read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False)


async def assert_replays(home: Path, source, target: str) -> None:
    """The translation, replayed by the target's tools in a fresh sandbox, leaves the source's diff."""
    translated = translate_trajectory(source, target)
    assert translated.agent.name == target and translated.task_id == source.task_id
    task = load_suite("swe-mini").get(source.task_id)
    async with AsyncOrchard(home=home) as orchard:
        replayed = await replay_patch(orchard, task, translated)
    assert replayed.patch == source.outcome.details["patch"] and replayed.patch.strip()
    # with the target tools' real output as observations, it is still the same trajectory
    exact = translate_trajectory(source, target, observations=replayed.observations)
    assert [s.tool_calls for s in exact.steps] == [s.tool_calls for s in translated.steps]


def scripted_config(url: str) -> GatewayConfig:
    return GatewayConfig(models={SCRIPTED: ModelRoute(model="openai/scripted", api_base=f"{url}/v1", api_key="unused")})


# react's file tools, one each, on a real task: view a directory and a file, edit with str_replace, create
# a file without a final newline, then submit
REACT_SCRIPT = [
    tool_calls(("view", {"path": "."}), content="Let me look around."),
    tool_calls(("view", {"path": "pagekit/paginator.py", "view_range": [15, 22]})),
    tool_calls(("str_replace", {"path": "pagekit/paginator.py",
                                "old_str": "        return self.total // self.per_page\n",
                                "new_str": "        # Round up: a partially filled last page is still a page.\n"
                                           "        return -(-self.total // self.per_page)\n"})),
    tool_calls(("create", {"path": "notes/why.txt", "content": "pages round up\nEOF\nno final newline"}),
               ("bash", {"command": "python -c 'import pagekit' && echo ok"})),
    tool_calls(("str_replace", {"path": "pagekit/paginator.py", "old_str": "not there", "new_str": "x"})),
    {"content": "All done, I think."},  # a reply without a tool call
    tool_calls(("submit", {"summary": "rounded up"})),
]


@pytest.mark.slow
async def test_react_trajectories_translated_to_mini_swe_agent_replay_to_the_same_diff(home, tmp_path, scripted):
    oracle = await record(home, tmp_path / "oracle", harness="react", model="oracle",
                          config=eval_gateway_config("oracle"), tasks=[PAGEKIT, LOGSTAMP])
    scripted.load(REACT_SCRIPT)
    (edited,) = await record(home, tmp_path / "scripted", harness="react", model=SCRIPTED,
                             config=scripted_config(scripted.url), tasks=[PAGEKIT])
    assert {t.agent.name for t in oracle} == {"react"} and edited.outcome.resolved
    for source in [*oracle, edited]:
        await assert_replays(home, source, "mini-swe-agent")

    translated = translate_trajectory(edited, "mini-swe-agent")
    commands = [json.loads(c.raw_arguments)["command"] for s in translated.steps for c in s.tool_calls]
    assert commands[0].startswith("echo . && find .") and commands[1] == "cat -n pagekit/paginator.py | sed -n '15,22p'"
    assert commands[2].startswith("python3 - <<'EOF'") and commands[-1] == SUBMIT_COMMAND
    assert {c.function_name for s in translated.steps for c in s.tool_calls} == {"bash"}
    # the prompts are mini-swe-agent's own, around the same task
    system, user = translated.steps[0].message, translated.steps[1].message
    assert system.startswith("You are a helpful assistant") and "Please solve this issue: " in user
    assert load_suite("swe-mini").get(PAGEKIT).instruction in user
    # one call per agent step, each the request mini-swe-agent would send, ready for build_examples
    agent_steps = [s for s in translated.steps if s.source == "agent"]
    assert [s.llm_call_ids for s in agent_steps] == [[c.id] for c in translated.llm_calls]
    last = translated.llm_calls[-1]
    assert last.request_params["tools"][0]["function"]["name"] == "bash" and last.prompt_token_ids is None
    roles = [m["role"] for m in last.request_messages]
    assert roles[:2] == ["system", "user"] and "tool" in roles
    tool_message = next(m for m in last.request_messages if m["role"] == "tool")
    assert json.loads(tool_message["content"])["returncode"] == 0  # mini.yaml's JSON observation
    # the reply without a tool call gets mini-swe-agent's format-error turn
    assert any(m["role"] == "user" and "Tool call error" in m["content"] for m in last.request_messages)
    assert translated.outcome == edited.outcome and translated.rollout_key == f"{edited.rollout_key}@mini-swe-agent"


@pytest.mark.slow
async def test_mini_swe_agent_trajectories_translated_to_react_replay_to_the_same_diff(home, tmp_path):
    sources = await record(home, tmp_path / "mini", harness="mini-swe-agent", model="oracle",
                           config=eval_gateway_config("oracle"), tasks=[PAGEKIT, LOGSTAMP])
    assert {t.agent.name for t in sources} == {"mini-swe-agent"} and all(t.outcome.resolved for t in sources)
    for source in sources:
        await assert_replays(home, source, "react")
    translated = translate_trajectory(sources[0], "react")
    names = [c.function_name for s in translated.steps for c in s.tool_calls]
    assert names == ["bash", "bash", "submit"]
    assert translated.steps[0].message.startswith("You are a software engineering agent")
    assert "<task>\n" + load_suite("swe-mini").get(sources[0].task_id).instruction in translated.steps[1].message
    observation = translated.steps[2].observation.results[0].content
    assert re.match(r"\[exit code 0\]\n", observation)  # react's way of showing a command's result
    # and back again: mini -> react -> mini gives mini's tool calls
    back = translate_trajectory(translated, "mini-swe-agent")
    assert [c.arguments for s in back.steps for c in s.tool_calls] == \
        [c.arguments for s in sources[0].steps for c in s.tool_calls]


def test_file_actions_as_shell_commands(tmp_path):
    """The bash forms of react's file tools, run with real bash on real files."""
    import subprocess

    def bash(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)

    content = "line one\nEOF\n  tab\there\n"
    assert bash(shell_command(Create("deep/er/f.txt", content))).returncode == 0
    assert (tmp_path / "deep/er/f.txt").read_text() == content
    assert bash(shell_command(Create("g.txt", "no newline"))).returncode == 0
    assert (tmp_path / "g.txt").read_text() == "no newline"
    assert bash(shell_command(Create("empty.txt", ""))).returncode == 0 and (tmp_path / "empty.txt").read_text() == ""
    viewed = bash(shell_command(View("deep/er/f.txt"))).stdout
    assert viewed == "     1\tline one\n     2\tEOF\n     3\t  tab\there\n"  # react's numbering
    assert bash(shell_command(View("deep/er/f.txt", (2, 3)))).stdout == "     2\tEOF\n     3\t  tab\there\n"
    (tmp_path / "crlf.txt").write_bytes(b"a = 1\r\nb = 'it''s'\r\n")
    done = bash(shell_command(Replace("crlf.txt", "b = 'it''s'", "b = \"$HOME\\n\"")))
    assert done.returncode == 0 and (tmp_path / "crlf.txt").read_bytes() == b"a = 1\r\nb = \"$HOME\\n\"\r\n"
    missing = bash(shell_command(Replace("crlf.txt", "nowhere", "x")))
    assert missing.returncode != 0 and "occurs 0 times" in missing.stderr


def test_a_tool_the_target_cannot_express_is_refused_not_guessed():
    from orchard.core.trajectory import Agent, Step, ToolCall, Trajectory

    trajectory = Trajectory(agent=Agent(name="react", version="1"), task_id="t", rollout_key="r", steps=[
        Step(step_id=1, source="system", message="s"),
        Step(step_id=2, source="user", message="Solve the following task in the repository at /w.\n\n<task>\nfix\n"
                                              "</task>\n\nWhen the change is complete and tested, call `submit`."),
        Step(step_id=3, source="agent", tool_calls=[ToolCall(tool_call_id="c", function_name="browse",
                                                             arguments={"url": "x"})])])
    with pytest.raises(UntranslatableCall, match="react has no tool 'browse'"):
        translate_trajectory(trajectory, "mini-swe-agent")
    kept, refused = translate_all([trajectory], "mini-swe-agent")
    assert kept == [] and "browse" in refused["r"]
    with pytest.raises(UntranslatableCall, match="translation knows"):
        translate_trajectory(trajectory, "no-such-harness")
    text_mode = trajectory.model_copy(update={"agent": Agent(name="mini-swe-agent", version="1",
                                                             extra={"mode": "text"})})
    with pytest.raises(UntranslatableCall, match="text mode"):
        translate_trajectory(text_mode, "react")
