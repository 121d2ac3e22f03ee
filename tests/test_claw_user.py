"""Multi-turn Claw tasks: the simulated user (orchard/worlds/claw/user.py, orchard/eval/user_simulator.py).

The user service on its own (script, `when`, the stop word, a finished conversation, bad seeds); claw-mini's
multi-turn tasks end to end through the evaluator in real local sandboxes with the oracle and the scripted user;
the same task with the user played by a model through the run's gateway (its calls recorded apart from the
agent's, under `<rollout key>.user`); a user model that fails making the rollout a model_error; a task whose user
only a model can play refused without --user-model. The model playing the user is the scripted model server
(orchard.testing.scripted_model: a real OpenAI-compatible server whose replies the test sets), since the test
must know what the user says to grade the task; any model the gateway serves is reached the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.errors import InvalidRequest
from orchard.core.task_suite import TaskSuite
from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.eval.user_simulator import EXTRA_KEY, USER_ROLLOUT_SUFFIX
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.worlds.claw.base import SeedError
from orchard.worlds.claw.task import claw_task
from orchard.worlds.claw.user import STOP, User
from tests.running_server import free_port, live_sandbox_ids
from tests.test_gateway import load_script, received, scripted  # noqa: F401 (the scripted model server fixture)

USER_TASKS = ["user-meeting-day", "user-todo-cleanup", "user-report-free-time"]
cli = CliRunner()


def trajectories(out: Path) -> dict:
    return {t["task_id"]: t for t in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}


# --- the user service -------------------------------------------------------------------------------------------

def test_the_scripted_user_answers_by_when_then_in_order_and_ends_with_the_stop_word():
    user = User({"persona": "p", "script": [{"reply": "Keep it.", "when": {"contains": "tax"}},
                                            {"reply": "Thursday."}, {"reply": f"Thanks {STOP}"}]})
    assert user.call("message_user", {"text": "Which day?"}) == (200, {"reply": "Thursday.", "done": False})
    assert user.call("message_user", {"text": "And the TAX to-do?"}) == (200, {"reply": "Keep it.", "done": False})
    assert user.call("message_user", {"text": "Done."}) == (200, {"reply": "Thanks", "done": True})
    status, answer = user.call("message_user", {"text": "Still there?"})
    assert status == 409 and "ended the conversation" in answer["error"]
    said = [(m["role"], m["text"]) for m in user.state["messages"]]
    assert said[:2] == [("agent", "Which day?"), ("user", "Thursday.")] and len(said) == 6
    assert [call["status"] for call in user.calls] == [200, 200, 200, 409]  # the refused message: in the audit
    assert user.state["done"] is True
    user.reset()
    assert user.state == {"messages": [], "done": False} and len(user.script) == 3


def test_a_spent_script_ends_the_conversation_and_a_persona_alone_needs_a_model():
    assert User({"script": [{"reply": "Yes."}]}).call("message_user", {"text": "a"})[1]["reply"] == "Yes."
    spent = User({"script": [{"reply": "Yes."}]})
    spent.call("message_user", {"text": "a"})
    assert spent.call("message_user", {"text": "b"}) == (200, {"reply": "(the user has nothing more to say)",
                                                              "done": True})
    status, answer = User({"persona": "You are Sam."}).call("message_user", {"text": "hi"})
    assert status == 503 and "--user-model" in answer["error"]


@pytest.mark.parametrize("seed, problem", [
    ({}, "user seed needs a persona (for a user model), a script (for a scripted user), or both"),
    ({"script": [{"text": "hi"}]}, "user seed.script[0] has unknown field(s) text; known: reply, when"),
    ({"script": [{"reply": "x", "when": {"near": "y"}}]}, "user seed.script[0].when"),
    ({"persona": "p", "messages": [{"role": "boss", "text": "x"}]}, "messages[0].role must be agent or user"),
])
def test_a_user_seed_that_cannot_be_used_says_why(seed, problem):
    with pytest.raises(SeedError) as raised:
        User(seed)
    assert problem in str(raised.value)


def test_a_claw_task_with_a_user_marks_who_plays_it_and_tells_the_agent_how_to_reach_them():
    spec = {"services": {"todo": {}, "user": {"seed": {"persona": "You are Sam."}}},
            "checks": [{"service": "user", "in": "messages", "where": {"role": "agent"}}]}
    task = claw_task("t", "Do it.", spec)
    assert {s.name: s.user_model for s in task.environment.services} == {"todo": None, "user": "required"}
    assert "services — todo — with their tools" in task.instruction
    assert "reach them only with the user tool message_user" in task.instruction
    spec["services"]["user"]["seed"]["script"] = [{"reply": "Yes."}]
    assert claw_task("t", "Do it.", spec).environment.services[1].user_model == "optional"
    suite = load_suite("claw-mini")
    assert {t.id for t in suite.tasks if "user" in t.metadata["claw"]["services"]} == set(USER_TASKS)


# --- through the evaluator ---------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_the_oracle_talks_with_the_scripted_user_and_resolves_every_multi_turn_task(embedded_home, tmp_path):
    out = tmp_path / "scripted"
    results = await run_eval(harness="react", model="oracle", suite="claw-mini", task_ids=USER_TASKS, out_dir=out,
                             gateway_config=eval_gateway_config("oracle"), backend="local", parallel=3)
    assert {(row.task_id, row.status, row.reward) for row in results.tasks} == {
        (task_id, "resolved", 1.0) for task_id in USER_TASKS}, [row.error for row in results.tasks]
    done = trajectories(out)
    for task_id in USER_TASKS:
        assert done[task_id]["extra"][EXTRA_KEY] == {"model": "script", "llm_calls": []}
    tail = done["user-todo-cleanup"]["outcome"]["details"]["output_tail"]
    assert "Sam was asked about the tax to-do" in tail
    assert not await live_sandbox_ids(embedded_home)


def _user_models(scripted_url: str) -> GatewayConfig:
    return GatewayConfig(models={
        "user-sim": ModelRoute(model="openai/scripted", api_base=f"{scripted_url}/v1", api_key="unused"),
        "user-down": ModelRoute(model="openai/down", api_base=f"http://127.0.0.1:{free_port()}/v1",
                                api_key="unused")})


@pytest.mark.slow
async def test_a_user_model_plays_the_user_through_the_gateway_recorded_apart_from_the_agent(
        embedded_home, tmp_path, scripted):
    load_script(scripted, [{"content": "Thursday 12 March at 15:00 works best for me."},
                           {"content": f"Great, thanks! {STOP}"}])
    out = tmp_path / "modelled"
    config = eval_gateway_config("oracle", config=_user_models(scripted))
    results = await run_eval(harness="react", model="oracle", suite="claw-mini", task_ids=["user-meeting-day"],
                             out_dir=out, gateway_config=config, backend="local", user_model="user-sim")
    (row,) = results.tasks
    assert (row.status, row.reward) == ("resolved", 1.0), row.error
    assert results.settings.user_model == "user-sim"
    trajectory = trajectories(out)["user-meeting-day"]
    user = trajectory["extra"][EXTRA_KEY]
    assert user["model"] == "user-sim" and len(user["llm_calls"]) == 2
    assert {call["rollout_key"] for call in user["llm_calls"]} == {trajectory["rollout_key"] + USER_ROLLOUT_SUFFIX}
    assert all(call["rollout_key"] == trajectory["rollout_key"] for call in trajectory["llm_calls"])
    asked = received(scripted)
    assert len(asked) == 2 and asked[0]["model"] == "scripted"
    system, *turns = asked[1]["messages"]
    assert system["role"] == "system" and "You want a 30-minute call with Dana Lee" in system["content"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]  # the agent's words are what it is told
    assert turns[0]["content"].startswith("Which day and time next week suits you")
    recorded = [json.loads(line)["rollout_key"] for line in (out / "calls.jsonl").read_text().splitlines()]
    assert recorded.count(trajectory["rollout_key"] + USER_ROLLOUT_SUFFIX) == 2
    assert not await live_sandbox_ids(embedded_home)


@pytest.mark.slow
async def test_a_user_model_that_fails_is_a_model_error_not_the_agents_failure(embedded_home, tmp_path, scripted):
    out = tmp_path / "down"
    config = eval_gateway_config("oracle", config=_user_models(scripted))
    results = await run_eval(harness="react", model="oracle", suite="claw-mini", task_ids=["user-report-free-time"],
                             out_dir=out, gateway_config=config, backend="local", user_model="user-down")
    (row,) = results.tasks
    assert (row.status, row.exit_status) == ("error", "model_error"), row
    assert "the simulated user's model 'user-down' failed: model_unreachable" in row.error
    user = trajectories(out)["user-report-free-time"]["extra"][EXTRA_KEY]
    assert user["model"] == "user-down" and user["llm_calls"][0]["error"].startswith("model_unreachable")
    assert not await live_sandbox_ids(embedded_home)


async def test_a_user_only_a_model_can_play_is_refused_without_one_before_any_sandbox(embedded_home, tmp_path):
    task = claw_task("needs-a-model", "Ask Sam what to do.", {
        "services": {"user": {"seed": {"persona": "You are Sam."}}},
        "checks": [{"service": "user", "in": "messages", "where": {"role": "agent"}}]})
    with pytest.raises(InvalidRequest, match="needs-a-model talk with a simulated user that has no script: give "
                                             "the model that plays it with --user-model NAME"):
        await run_eval(harness="react", model="oracle", suite=TaskSuite(name="s", tasks=[task]),
                       out_dir=tmp_path / "run", gateway_config=eval_gateway_config("oracle"), backend="local")
    assert not (tmp_path / "run").exists()


def test_a_user_model_no_provider_serves_is_refused_by_the_cli(tmp_path):
    done = cli.invoke(app, ["eval", "--harness", "react", "--model", "oracle", "--suite", "claw-mini",
                            "--tasks", "user-meeting-day", "--user-model", "no-such-provider-model",
                            "--out", str(tmp_path / "cli")])
    assert done.exit_code == 2 and "model 'no-such-provider-model' has no provider" in done.output, done.output
