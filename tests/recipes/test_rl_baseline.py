"""BAR in `orchard train rl`, right: the advantages TRL trains on use the baseline of ALL the task's rollouts
of the step (Reinforce-Ada's global statistics), and a task that gives no group is replaced by one from the
run's pool, so a step trains full groups while the pool has tasks that are not retired.

The environment here is a FAKE (`ScriptedRollouts`): it returns graded trajectories with scripted rewards
instead of running the harness in sandboxes, because these tests are about the allocation and the advantage
arithmetic, not the rollouts. The trainer is real: TRL's GRPOTrainer (Orchard's subclass) on the tiny random
Qwen3, one real optimizer step. The real-parts GRPO step (real sandboxes, real grader) is in test_rl.py."""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from orchard.core.trajectory import Agent, LLMCall, Outcome, Trajectory
from orchard.eval.suites import load_suite
from orchard.recipes.bar.config import BarConfig
from orchard.recipes.rl.baseline import EPS, advantage, task_baseline
from orchard.recipes.rl.rollout_func import BarRolloutFunc

A, B, C = "orchard__pagekit-112", "orchard__logstamp-57", "orchard__csvlite-23"


class ScriptedRollouts:
    """A FAKE RolloutEnv: each task's rollouts get the next reward of its script ("error": an infrastructure
    error), as graded trajectories with one recorded model call."""

    policy = None

    def __init__(self, scripts: dict[str, list[float | str]]) -> None:
        self.scripts = {task_id: list(rewards) for task_id, rewards in scripts.items()}
        self.ran: list[str] = []

    def call(self, work):
        return asyncio.run(work)

    async def arollout(self, task, rollout_key):
        self.ran.append(task.id)
        outcome = self.scripts[task.id].pop(0)
        agent = Agent(name="react", version="test")
        if outcome == "error":
            return Trajectory(agent=agent, task_id=task.id, rollout_key=rollout_key, exit_status="sandbox_error",
                              outcome=Outcome(error="sandbox_error: the sandbox was lost"))
        call = LLMCall(id="c1", prompt_token_ids=[1, 2, 3], completion_token_ids=[10, 11], logprobs=[-0.5, -0.5])
        return Trajectory(agent=agent, task_id=task.id, rollout_key=rollout_key, exit_status="submitted",
                          outcome=Outcome(reward=outcome, resolved=outcome == 1.0), llm_calls=[call])


class Trainer:  # what the rollout function reads of GRPOTrainer
    def __init__(self, group_size: int) -> None:
        self.num_generations = self.num_generations_eval = group_size
        self.model = type("Model", (), {"training": True})()


@pytest.fixture(scope="module")
def tasks():
    suite = load_suite("swe-mini")
    return {task_id: suite.get(task_id) for task_id in (A, B, C)}


def test_the_baseline_is_every_graded_rollout_of_the_task_errors_left_out(tasks):
    env = ScriptedRollouts({A: [0.0, "error", 0.0, 0.0, 0.0, 0.0, 1.0]})
    func = BarRolloutFunc(env=env, tasks={A: tasks[A]}, pad_id=0, bar=BarConfig(retire_after=6, max_rollouts=8))
    output = func([A, A], Trainer(2))
    assert sorted(output["rollout_reward"]) == [0.0, 1.0]  # the balanced group (1+, 1-) is trained
    assert output["baseline_mean"] == pytest.approx([1 / 6, 1 / 6])  # from all six graded rollouts
    assert output["baseline_std"] == pytest.approx([statistics.stdev([1, 0, 0, 0, 0, 0])] * 2)
    assert func.reports[0].rollouts == 7 and func.reports[0].errors == 1


def test_advantage_formula():
    baseline = task_baseline([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert baseline.mean == pytest.approx(1 / 6) and baseline.rollouts == 6
    assert advantage(1.0, baseline.mean, baseline.std) == pytest.approx((5 / 6) / (math.sqrt(1 / 6) + EPS))
    assert advantage(0.0, baseline.mean, baseline.std, scale=False) == pytest.approx(-1 / 6)
    assert advantage(None, baseline.mean, baseline.std) == 0.0  # a placeholder
    assert task_baseline([1.0]) is None and advantage(1.0, None, None) == 0.0  # no baseline: nothing learned


@pytest.mark.model
def test_trl_trains_a_balanced_group_with_advantages_from_all_the_tasks_rollouts(tasks, tmp_path):
    """1 success in 6 rollouts: the trained pair's advantages are (1 - 1/6)/std and (0 - 1/6)/std over all
    six, as TRL computes them in the step (not ±0.71, the balanced pair's own mean 0.5)."""
    torch = pytest.importorskip("torch")
    from datasets import Dataset
    from trl import GRPOConfig

    from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3
    from orchard.recipes.rl.rollout_func import orchard_reward
    from orchard.recipes.rl.trainer import OrchardGRPOTrainer

    tokenizer = smollm2_tokenizer()
    model = tiny_qwen3(tokenizer)
    env = ScriptedRollouts({A: [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]})
    func = BarRolloutFunc(env=env, tasks={A: tasks[A]}, pad_id=tokenizer.pad_token_id or 0,
                          bar=BarConfig(retire_after=6, max_rollouts=8))
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1,
                      learning_rate=1e-2, beta=0.0, logging_steps=1, save_strategy="no", report_to=[],
                      use_cpu=True, max_completion_length=64, disable_tqdm=True)
    trainer = OrchardGRPOTrainer(model=model, reward_funcs=[orchard_reward], args=args,
                                 train_dataset=Dataset.from_list([{"prompt": A}]), processing_class=tokenizer,
                                 rollout_func=func)
    scored = []
    score = trainer._generate_and_score_completions

    def capture(inputs):  # the batch as TRL scored it, advantages included
        scored.append(score(inputs))
        return scored[-1]

    trainer._generate_and_score_completions = capture
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    (batch,) = scored
    rewards = func.last_output["rollout_reward"]
    std = statistics.stdev([1, 0, 0, 0, 0, 0])
    expected = [(r - 1 / 6) / (std + EPS) for r in rewards]
    assert batch["advantages"].tolist() == pytest.approx(expected, rel=1e-5)
    assert sorted(batch["advantages"].tolist()) == pytest.approx([-0.408, 2.041], abs=1e-3)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


def test_a_retired_task_is_replaced_from_the_pool_and_stays_retired_across_steps(tasks):
    env = ScriptedRollouts({A: [0.0] * 5, B: [1.0, 0.0, 1.0, 0.0], C: [0.0, 1.0, 0.0, 1.0]})
    func = BarRolloutFunc(env=env, tasks=tasks, pad_id=0, bar=BarConfig(group_size=4))
    first = func([A] * 4, Trainer(4))
    report = func.reports[0]
    assert report.retired == {A: "all_fail"} and report.replaced == {A: B}
    assert report.placeholders == 0 and report.groups == report.informative_groups == 1
    assert first["task_id"] == [B] * 4 and sorted(first["rollout_reward"]) == [0.0, 0.0, 1.0, 1.0]
    assert first["baseline_mean"] == [0.5] * 4  # B's own rollouts: its baseline, not A's
    env.ran.clear()
    second = func([A] * 4, Trainer(4))  # TRL's sampler brings A back: retired for the run, not sampled again
    assert A not in env.ran and func.reports[1].replaced == {A: C}
    assert second["task_id"] == [C] * 4 and func.reports[1].placeholders == 0


def test_placeholders_only_when_the_pool_is_exhausted(tasks):
    env = ScriptedRollouts({A: [0.0] * 5, B: [1.0] * 5, C: [0.0] * 5})
    func = BarRolloutFunc(env=env, tasks=tasks, pad_id=0, bar=BarConfig(group_size=4))
    output = func([A] * 4, Trainer(4))
    report = func.reports[0]
    assert report.retired == {A: "all_fail", B: "all_pass", C: "all_fail"}  # every task tried, none with signal
    assert report.placeholders == 4 and output["rollout_reward"] == [None] * 4
    assert output["baseline_mean"] == [None] * 4
