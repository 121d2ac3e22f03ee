"""A simulated policy that learns from the groups an allocator builds, so that allocators can be compared on
what training gets out of their rollouts, not only on how many they spend (bench/rl_wasted_rollouts.py).

Each task x has a pass rate p_x = sigmoid(theta_x); a rollout is a coin flip at the current p_x. After each
step, every trained rollout i of task x moves theta_x by the term GRPO's loss gives it, for a policy whose
only choice on x is to succeed or to fail:

    theta_x += lr * sum_i A_i * (r_i - p_x) / n

- A_i = (r_i - mean) / (std + eps) over every graded rollout of x in the step — the baseline Orchard trains
  with (orchard.recipes.rl.baseline); for fixed and DAPO groups it is the group's own, as in GRPO;
- r_i - p_x is d log P(r_i) / d theta_x for a success/failure outcome with logit theta_x;
- n is the number of rollouts trained in the step: TRL's default loss ("dapo") averages over the batch's
  trained tokens, so a step's groups share one step size, and a group whose advantages are all 0 dilutes it.

Tasks learn independently (no transfer between them). A task at pass rate 0 or 1 never shows both rewards,
so it cannot move. The reward the policy reaches is its mean pass rate over the whole pool."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Hashable
from dataclasses import dataclass, field

from orchard.recipes.bar.allocator import Allocator
from orchard.recipes.bar.config import BarConfig, Strategy
from orchard.recipes.bar.simulation import RunTally, simulate_run
from orchard.recipes.rl.baseline import advantage, task_baseline

EDGE = 1e-6  # pass rates are kept inside (EDGE, 1 - EDGE) once they move


class LearningPolicy:
    def __init__(self, rates: dict[Hashable, float], *, lr: float, seed: int = 0) -> None:
        self.rates = dict(rates)
        self.lr = lr
        self._rng = random.Random(seed)

    def rollout(self, prompt_id: Hashable) -> float:
        return 1.0 if self._rng.random() < self.rates[prompt_id] else 0.0

    def train(self, allocator: Allocator) -> None:
        """One optimizer step on the groups `allocator` built (see the module docstring)."""
        groups = allocator.groups()
        trained = sum(len(group.rewards) for group in groups)
        if not trained:
            return
        steps: dict[Hashable, float] = {}
        for group in groups:
            baseline = task_baseline(allocator.graded(group.prompt_id))
            if baseline is None:
                continue
            rate = self.rates[group.prompt_id]
            steps[group.prompt_id] = sum(advantage(r, baseline.mean, baseline.std) * (r - rate)
                                         for r in group.rewards)
        for prompt_id, gradient in steps.items():
            if gradient:
                rate = min(max(self.rates[prompt_id], EDGE), 1 - EDGE)
                logit = math.log(rate / (1 - rate)) + self.lr * gradient / trained
                self.rates[prompt_id] = 1 / (1 + math.exp(-logit))

    def mean_reward(self) -> float:
        return statistics.fmean(self.rates.values())


@dataclass
class LearningRun:
    tally: RunTally
    initial_reward: float
    curve: list[tuple[int, float]] = field(default_factory=list)  # (rollouts spent, mean reward) per step

    @property
    def final_reward(self) -> float:
        return self.curve[-1][1] if self.curve else self.initial_reward

    def reward_at(self, rollouts: int) -> float:
        """The mean reward after the last step that ended within `rollouts` rollouts."""
        reached = [reward for spent, reward in self.curve if spent <= rollouts]
        return reached[-1] if reached else self.initial_reward


def learning_run(strategy: Strategy, rates: dict[Hashable, float], *, budget: int, batch_groups: int,
                 config: BarConfig, lr: float, seed: int = 0, memory: bool | None = None) -> LearningRun:
    """Train a `LearningPolicy` on `rates` with `strategy`'s groups until `budget` rollouts are spent."""
    policy = LearningPolicy(rates, lr=lr, seed=seed)
    run = LearningRun(tally=RunTally(strategy=strategy, steps=0), initial_reward=policy.mean_reward())
    spent = 0

    def on_step(allocator: Allocator) -> None:
        nonlocal spent
        policy.train(allocator)
        spent += allocator.stats().rollouts
        run.curve.append((spent, policy.mean_reward()))

    run.tally = simulate_run(strategy, list(rates), policy.rollout, steps=budget, batch_groups=batch_groups,
                             config=config, seed=seed, memory=memory, budget=budget, on_step=on_step)
    return run
