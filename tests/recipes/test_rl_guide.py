"""Guided rollouts (orchard.recipes.rl.guide): what makes `make train-demo`'s RL step train. A policy that never
solves its task gives BAR only failures — no signal, nothing trained; with the oracle guiding every second
rollout of a task, the group holds a success and a failure. On real parts: the tiny random Qwen3 as the
policy (TrainingPolicy, token in / token out), react's real prompt for a swe-mini task; the slow test runs
the GRPO step itself on real rollouts in real sandboxes, graded by the real grader."""

from __future__ import annotations

import json
import math

import pytest

from orchard.eval.suites import load_suite
from orchard.recipes.bar.config import BarConfig
from orchard.recipes.bar.strategies import BalancedAllocator
from orchard.recipes.rl.guide import GUIDED, SAMPLED, OracleGuide

pytestmark = pytest.mark.model  # torch and the embedded model's tokenizer

TASK_ID = "orchard__pagekit-112"


@pytest.fixture(scope="module")
def policy():
    import torch

    from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3
    from orchard.recipes.rl.policy import TrainingPolicy

    torch.manual_seed(0)
    tokenizer = smollm2_tokenizer()
    task = load_suite("swe-mini").get(TASK_ID)
    guide = OracleGuide(load_suite("swe-mini").tasks, every=2)
    return TrainingPolicy(tiny_qwen3(tokenizer), tokenizer, forced=guide), guide, task


def _react_request(task):
    from orchard.core.dialect import harness_dialect

    return harness_dialect("react").initial_messages(task.id, task.instruction, task.environment.workdir)


def test_every_second_rollout_of_a_task_plays_the_oracle_scored_by_the_policy(policy):
    training, guide, task = policy
    messages, tools = _react_request(task)
    replies = {key: training.complete(messages, tools, {"max_tokens": 6, "temperature": 1.0}, rollout_key=key,
                                      timeout_s=None) for key in ("r1", "r2", "r3", "r4")}
    assert [guide.role(key) for key in replies] == [SAMPLED, GUIDED, SAMPLED, GUIDED]
    assert guide.task_of(messages).id == TASK_ID
    for key in ("r2", "r4"):  # the oracle's first action, as the policy's own tokens with its own logprobs
        reply = replies[key]
        (call,) = reply.message["tool_calls"]
        assert call["function"]["name"] == "bash" and "git apply" in json.loads(call["function"]["arguments"])["command"]
        assert len(reply.logprobs) == len(reply.completion_token_ids) > 50
        assert all(math.isfinite(entry.logprob) and entry.logprob <= 0 for entry in reply.logprobs)
    for key in ("r1", "r3"):  # sampled: at most max_tokens, no patch
        assert len(replies[key].completion_token_ids) <= 6 and "tool_calls" not in replies[key].message
    # a second call of a guided rollout gets the oracle's next step, not a new role
    assert guide.role("r2") == GUIDED and guide.role("never-seen") == SAMPLED

    # what BAR makes of it: the sampled rollouts fail, the guided ones solve -> one balanced group at once
    allocator = BalancedAllocator([TASK_ID], batch_groups=1, config=BarConfig(group_size=2, retire_after=2))
    (request,) = allocator.next_requests()
    keys = iter(replies)
    for _ in range(request.count):
        allocator.record(TASK_ID, 1.0 if guide.role(next(keys)) == GUIDED else 0.0)
    (group,) = allocator.groups()
    assert sorted(group.rewards) == [0.0, 1.0] and group.spent == 2 and not allocator.retired()


def test_a_call_of_no_known_task_is_sampled(policy):
    _, guide, _ = policy
    assert guide("other", [{"role": "user", "content": "an unrelated request"}], None) is None
    with pytest.raises(ValueError, match="at least 1"):
        OracleGuide([], every=0)


@pytest.mark.slow
def test_a_guided_grpo_step_trains_on_a_mixed_group(tmp_path):
    """The demo's RL step with the tiny policy: one sampled rollout (fails), one guided (resolves), a GRPO
    step on that group: the weights change and a loss is logged."""
    from orchard.recipes.rl.train import RLConfig, train_rl

    reports = []
    config = RLConfig(out=tmp_path / "rl", tasks=[TASK_ID], num_generations=2, max_steps=1, learning_rate=1e-2,
                      harness_options={"step_limit": 3}, max_tokens=8, guide="oracle",
                      bar=BarConfig(retire_after=2, max_rollouts=4))
    result = train_rl(config, on_step=reports.append)
    (report,) = reports
    assert report.informative_groups == 1 and sorted(report.rewards[TASK_ID]) == [0.0, 1.0]
    behaviours = {r["behaviour"]: r["reward"] for r in report.rollout_log}
    assert behaviours == {SAMPLED: 0.0, GUIDED: 1.0}
    assert result.steps == 1 and result.weights_changed and result.losses and report.trained_tokens > 0
