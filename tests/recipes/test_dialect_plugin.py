"""A harness that is not Orchard's joins cross-harness distillation and credit assignment by declaring its
dialect: `shelly` (tests/recipes/shelly_harness.py, outside orchard/, with tools, prompts and result framing of
its own) is installed as a plug-in is, an entry point in the `orchard.harnesses` group of a distribution on
sys.path, and found by name. Fast: a react rollout translated into shelly and back. Real (slow): react and
shelly rollouts recorded by the evaluator in real sandboxes, each translated into the other harness (and
shelly's into mini-swe-agent), replayed by the target's tools to the source's diff; a failed shelly rollout
valued by credit assignment through shelly's own replay, its credit carried into react by the translation."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import orchard
from orchard.core.actions import Replace, UntranslatableCall
from orchard.core.dialect import Dialect, dialect_harnesses, harness_dialect
from orchard.core.harness import ENTRY_POINT_GROUP, get_harness
from orchard.core.trajectory import Agent, Observation, ObservationResult, Outcome, Step, ToolCall, Trajectory
from orchard.eval.models import eval_gateway_config
from orchard.eval.suites import load_suite
from orchard.recipes.credit.assign import assign_credit
from orchard.recipes.credit.sft import remap_credit
from orchard.recipes.credit.values import CreditSettings
from orchard.recipes.translate.replay import replay_patch
from orchard.recipes.translate.trajectory import translate_all, translate_trajectory
from orchard.sandbox.client import AsyncOrchard
from orchard.util.shell_forms import shell_command
from tests.harness_rig import tool_calls
from tests.plugin_site import write_distribution
from tests.recipes.shelly_harness import NUDGE, ShellyDialect, ShellyHarness
from tests.recipes.test_translate import PAGEKIT, record, scripted_config

WORKDIR = "/testbed"
PAGER = "pagekit/paginator.py"
OLD = "        return self.total // self.per_page\n"
COMMENT = "        # Round up: a partially filled last page is still a page.\n"
WRONG = "        return self.total // self.per_page + 1\n"


class MuteHarness:
    """A harness that declares no dialect."""

    name, version = "mute", "1"

    async def run(self, task, sandbox, model):
        raise NotImplementedError


@pytest.fixture(scope="module")
def shelly(tmp_path_factory):
    """shelly and mute installed as a third party's package would be: their entry points in a distribution on
    sys.path (the modules are this test tree's)."""
    site = tmp_path_factory.mktemp("shelly-site")
    write_distribution(site, "orchard-shelly", "0.1.0", ENTRY_POINT_GROUP, {
        "shelly": "tests.recipes.shelly_harness:ShellyHarness",
        "mute": "tests.recipes.test_dialect_plugin:MuteHarness"}, {})
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        yield


def test_the_plug_in_is_found_by_name_with_the_dialect_it_declares(shelly):
    harness = get_harness("shelly")
    assert isinstance(harness, ShellyHarness)
    assert not Path(inspect.getfile(ShellyHarness)).is_relative_to(Path(orchard.__file__).parent)
    dialect = harness_dialect("shelly")
    assert isinstance(dialect, Dialect) and isinstance(dialect, ShellyDialect) and dialect.version == "0.1.0"
    assert {"shelly", "react", "mini-swe-agent", "kimi-cli", "openhands"} <= set(dialect_harnesses())
    assert "mute" not in dialect_harnesses()
    with pytest.raises(UntranslatableCall, match="'mute': it declares no dialect .*translation knows .*shelly"):
        harness_dialect("mute")


def _react_rollout() -> Trajectory:
    """A react rollout of PAGEKIT as react records one: its prompts, a command, a new file, an edit, a view,
    a reply without a tool call (react nudges), submit."""
    react = harness_dialect("react")
    task = load_suite("swe-mini").get(PAGEKIT)
    messages, _ = react.initial_messages(PAGEKIT, task.instruction, WORKDIR)
    steps = [Step(step_id=1, source="system", message=messages[0]["content"]),
             Step(step_id=2, source="user", message=messages[1]["content"])]
    calls = [("bash", {"command": "ls pagekit"}, "[exit code 0]\n__init__.py\npaginator.py\n"),
             ("create", {"path": "notes/why.txt", "content": "pages round up\n"},
              "Created /testbed/notes/why.txt (1 lines)."),
             ("str_replace", {"path": PAGER, "old_str": OLD, "new_str": COMMENT + OLD}, f"Edited /testbed/{PAGER}."),
             ("view", {"path": PAGER, "view_range": [15, 16]}, "    15\tx\n    16\ty"),
             None,
             ("submit", {"summary": "rounded up"}, "Submitted.")]
    for number, call in enumerate(calls):
        if call is None:
            steps += [Step(step_id=len(steps) + 1, source="agent", message="Thinking."),
                      Step(step_id=len(steps) + 2, source="user", message=react.no_tool_call_message())]
            continue
        name, arguments, result = call
        steps.append(Step(step_id=len(steps) + 1, source="agent", message=f"step {number}", tool_calls=[
            ToolCall(tool_call_id=f"c{number}", function_name=name, arguments=arguments)],
            observation=Observation(results=[ObservationResult(source_call_id=f"c{number}", content=result)])))
    return Trajectory(agent=Agent(name="react", version="1"), task_id=PAGEKIT, rollout_key="r1", steps=steps,
                      outcome=Outcome(resolved=False, reward=0.0))


def _calls(trajectory: Trajectory) -> list[tuple[str, dict]]:
    return [(c.function_name, c.arguments) for s in trajectory.steps for c in s.tool_calls]


def test_a_react_rollout_translates_into_the_plug_in_and_back(shelly):
    source = _react_rollout()
    to_shelly = translate_trajectory(source, "shelly")
    assert to_shelly.agent.name == "shelly" and to_shelly.rollout_key == "r1@shelly"
    names = [name for name, _ in _calls(to_shelly)]
    # bash -> shell, create -> write_file, str_replace and view -> its shell, submit -> done
    assert names == ["shell", "write_file", "shell", "shell", "done"]
    assert _calls(to_shelly)[0][1] == {"cmd": "ls pagekit"}
    assert _calls(to_shelly)[1][1] == {"path": "notes/why.txt", "text": "pages round up\n"}
    assert _calls(to_shelly)[3][1]["cmd"] == f"cat -n {PAGER} | sed -n '15,16p'"
    # shelly's own prompts, its framing of a command's result, its nudge after the reply without a tool call
    assert to_shelly.steps[0].message.startswith("You are shelly") and to_shelly.steps[1].message.startswith(
        f"TASK {PAGEKIT}\n")
    assert to_shelly.steps[2].observation.results[0].content == "$? = 0\n__init__.py\npaginator.py\n"
    assert any(s.source == "user" and s.message == NUDGE for s in to_shelly.steps)
    assert to_shelly.llm_calls[0].request_params["tools"][0]["function"]["name"] == "shell"

    back = translate_trajectory(to_shelly, "react")  # shelly -> react: its task read back out of its prompts
    assert [name for name, _ in _calls(back)] == ["bash", "create", "bash", "bash", "submit"]
    assert _calls(back)[:2] == _calls(source)[:2] and _calls(back)[-1] == ("submit", {"summary": "rounded up"})
    assert back.steps[1].message == source.steps[1].message  # react's instance template, the same task
    assert back.steps[2].observation.results[0].content == source.steps[2].observation.results[0].content


# --- real runs ----------------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_react_and_plug_in_rollouts_translate_both_ways_and_replay_to_the_same_diff(shelly, sandbox_home,
                                                                                           tmp_path):
    oracle = eval_gateway_config("oracle")
    (react,) = await record(sandbox_home, tmp_path / "react", harness="react", model="oracle", config=oracle,
                            tasks=[PAGEKIT])
    (mine,) = await record(sandbox_home, tmp_path / "shelly", harness="shelly", model="oracle", config=oracle,
                           tasks=[PAGEKIT])
    assert mine.agent.name == "shelly" and mine.outcome.resolved and react.outcome.resolved
    assert [name for name, _ in _calls(mine)] == ["shell", "shell", "done"]
    task = load_suite("swe-mini").get(PAGEKIT)
    async with AsyncOrchard(home=sandbox_home) as orch:
        for source, target in [(react, "shelly"), (mine, "react"), (mine, "mini-swe-agent")]:
            translated = translate_trajectory(source, target)
            assert translated.agent.name == target
            replayed = await replay_patch(orch, task, translated)  # the target's own tools
            assert replayed.patch == source.outcome.details["patch"] and replayed.patch.strip(), (source.agent.name,
                                                                                                 target)
            exact = translate_trajectory(source, target, observations=replayed.observations)
            assert _calls(exact) == _calls(translated)


FAILED_SCRIPT = [
    tool_calls(("shell", {"cmd": f"grep -n per_page {PAGER}"})),  # opens the gold file
    tool_calls(("shell", {"cmd": shell_command(Replace(PAGER, OLD, COMMENT + OLD))})),  # half of the gold patch
    tool_calls(("shell", {"cmd": shell_command(Replace(PAGER, OLD, WRONG))})),  # the wrong fix
    tool_calls(("shell", {"cmd": "ls pagekit"})),
    tool_calls(("done", {"note": "added one page"})),
]


@pytest.mark.slow
async def test_credit_assignment_values_a_failed_plug_in_rollout_through_its_own_replay(shelly, sandbox_home,
                                                                                         tmp_path, scripted):
    scripted.load(FAILED_SCRIPT)
    (failed,) = await record(sandbox_home, tmp_path / "failed", harness="shelly", model="scripted",
                             config=scripted_config(scripted.url), tasks=[PAGEKIT])
    assert failed.agent.name == "shelly" and failed.outcome.resolved is False and failed.outcome.error is None
    async with AsyncOrchard(home=sandbox_home) as orch:
        report = await assign_credit([failed], {PAGEKIT: load_suite("swe-mini").get(PAGEKIT)}, orch,
                                     CreditSettings(smoothing=0.0, run_tests=False))
    (credit,) = report.rollouts
    assert credit.error is None and credit.harness == "shelly" and credit.replay_matches_record, credit
    # the diff after each step against the gold patch: nothing, the comment (F1 0.5), the wrong return; the
    # first command names the gold file
    assert credit.proxies["diff_overlap"] == pytest.approx([0.0, 0.5, 2 / 3, 2 / 3, 2 / 3])
    assert credit.proxies["gold_files_opened"] == [1.0] * 5
    agent_ids = [s.step_id for s in failed.steps if s.source == "agent"]
    assert set(credit.step_weights) == set(agent_ids[:3]) and credit.steps[-1].submits  # done: never trained

    # the credit follows the rollout into another harness
    (translated,), refused = translate_all([failed], "react")
    assert not refused
    remap_credit(report, [translated], "react")
    (moved,) = report.rollouts
    assert moved.rollout_key == translated.rollout_key and moved.harness == "react"
    react_ids = [s.step_id for s in translated.steps if s.source == "agent"]
    assert set(moved.step_weights) == set(react_ids[:3])
