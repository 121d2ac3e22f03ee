"""BAR's allocator and its baselines (fixed GRPO groups, DAPO's zero-variance filter) on seeded simulated
pass rates: balanced groups, retirement of prompts without signal, infrastructure errors never counted as
a zero reward, and fewer rollouts per informative group than DAPO on a U-shaped pass-rate distribution."""

from __future__ import annotations

import random

import pytest

from orchard.recipes.bar.allocator import drive
from orchard.recipes.bar.config import BarConfig
from orchard.recipes.bar.records import PromptHistory
from orchard.recipes.bar.simulation import coin_flips, hard_swe_pass_rates, simulate_run
from orchard.recipes.bar.strategies import (BalancedAllocator, DynamicSamplingAllocator, FixedGroupAllocator,
                                            make_allocator)


def sampler(pass_rates: dict[str, float], seed: int = 0, error_rate: float = 0.0):
    rng = random.Random(seed)

    def rollout(prompt_id):
        if error_rate and rng.random() < error_rate:
            return "sandbox_error: the sandbox was lost"
        return 1.0 if rng.random() < pass_rates[prompt_id] else 0.0
    return rollout


def test_bar_groups_are_balanced_and_full_when_the_prompt_has_signal():
    rates = {f"p{i}": 0.5 for i in range(6)}
    config = BarConfig(group_size=8, max_rollouts=24)
    allocator = drive(BalancedAllocator(rates, batch_groups=4, config=config), sampler(rates))
    groups = allocator.groups()
    assert len(groups) == 4
    for group in groups:
        rewards = group.rewards
        assert len(rewards) == 8 and rewards.count(1.0) == 4 and rewards.count(0.0) == 4
        assert group.informative and group.spent >= 8
        assert len({r.rollout_id for r in group.rollouts}) == 8


def test_bar_retires_all_pass_and_all_fail_prompts_after_its_budget():
    rates = {"never": 0.0, "always": 1.0, "half": 0.5}
    config = BarConfig(group_size=4, first_round=2, retire_after=4, max_rollouts=12)
    allocator = drive(BalancedAllocator(rates, batch_groups=3, config=config), sampler(rates))
    assert allocator.retired() == {"never": "all_fail", "always": "all_pass"}
    spent = {p: len(s.results) for p, s in allocator._states.items()}
    assert spent["never"] == 4 and spent["always"] == 4  # retired exactly at the budget
    assert [g.prompt_id for g in allocator.groups()] == ["half"]
    assert allocator.done


def test_bar_out_of_budget_fills_its_group_with_the_commoner_reward():
    """Reinforce-Ada's fallback: every rollout of the scarcer reward, then the commoner one up to G (the
    advantage's baseline is all the task's rollouts, so the unbalanced group is not biased)."""
    rates = {"rare": 0.15}
    rollout = iter([0.0, 1.0] + [0.0] * 14)  # one positive in 16
    config = BarConfig(group_size=8, retire_after=2, max_rollouts=16)
    allocator = drive(BalancedAllocator(rates, batch_groups=1, config=config), lambda _: next(rollout))
    (group,) = allocator.groups()
    assert group.rewards == [1.0] + [0.0] * 7 and group.spent == 16
    assert allocator.graded("rare") == [0.0, 1.0] + [0.0] * 14  # what its advantages are centred on


def test_bar_out_of_budget_keeps_balanced_pairs_only_without_fill():
    rates = {"rare": 0.15}
    rollout = iter([0.0, 1.0] + [0.0] * 14)
    config = BarConfig(group_size=8, retire_after=2, max_rollouts=16, fill_group=False)
    allocator = drive(BalancedAllocator(rates, batch_groups=1, config=config), lambda _: next(rollout))
    (group,) = allocator.groups()
    assert group.rewards == [1.0, 0.0] and group.spent == 16


def test_bar_spends_at_most_g_rollouts_per_task_and_step_by_default():
    """What DAPO spends on a task: past G, the scarcer reward's extra rollouts cost more than they bring."""
    assert BarConfig(group_size=8).rollout_cap == 8
    assert BarConfig(group_size=4).rollout_cap == 5  # never under retire_after
    rewards = iter([1.0] + [0.0] * 20)
    allocator = drive(BalancedAllocator(["rare"], batch_groups=1, config=BarConfig(group_size=8)),
                      lambda _: next(rewards))
    (group,) = allocator.groups()
    assert group.spent == 8 and sorted(group.rewards) == [0.0] * 7 + [1.0]


def test_error_rollouts_are_never_a_zero_reward():
    rates = {f"p{i}": 0.5 for i in range(8)}
    config = BarConfig(group_size=4, max_errors=100, max_rollouts=40)
    allocator = drive(BalancedAllocator(rates, batch_groups=4, config=config), sampler(rates, error_rate=0.3))
    stats = allocator.stats()
    assert stats.errors > 0
    for group in allocator.groups():
        assert all(not r.is_error and r.reward is not None for r in group.rollouts)
        assert group.rewards.count(1.0) == group.rewards.count(0.0) == 2  # replacements asked for
    # all errors on a prompt whose policy always fails: not "all_fail", an error-retired prompt
    broken = BalancedAllocator(["p"], batch_groups=1, config=BarConfig(group_size=4, max_errors=3))
    drive(broken, lambda _: "model_error: the API failed")
    assert broken.retired() == {"p": "errors"} and broken.groups() == []
    stats = broken.stats()  # the round in flight when the third error came still counts
    assert stats.errors == stats.rollouts >= 3


def test_errors_leave_fixed_and_dapo_groups_short_not_zero():
    allocator = FixedGroupAllocator(["p"], batch_groups=1, config=BarConfig(group_size=4))
    (request,) = allocator.next_requests()
    assert request.count == 4
    for outcome in (1.0, "sandbox_error", 1.0, 1.0):
        allocator.record("p", error=outcome) if isinstance(outcome, str) else allocator.record("p", outcome)
    (group,) = allocator.groups()
    assert group.rewards == [1.0, 1.0, 1.0] and not group.informative and group.spent == 4
    with pytest.raises(ValueError):
        allocator.record("p", 0.0, error="both")


def test_dapo_keeps_only_mixed_groups_and_draws_more_prompts():
    rates = {"a": 0.0, "b": 1.0, "c": 0.5, "d": 0.5, "e": 0.5}
    config = BarConfig(group_size=4)
    allocator = drive(DynamicSamplingAllocator(rates, batch_groups=2, config=config), sampler(rates, seed=3))
    assert all(g.informative for g in allocator.groups()) and len(allocator.groups()) == 2
    assert allocator.retired()["a"] == "all_fail" and allocator.retired()["b"] == "all_pass"
    assert allocator.stats().rollouts % 4 == 0


def test_fixed_grpo_keeps_zero_variance_groups():
    rates = {"a": 0.0, "b": 1.0}
    allocator = drive(FixedGroupAllocator(rates, batch_groups=2, config=BarConfig(group_size=4)), sampler(rates))
    assert [g.informative for g in allocator.groups()] == [False, False]
    assert allocator.stats().rollouts_per_informative_group == float("inf")


def test_in_flight_rollouts_are_not_requested_twice():
    allocator = BalancedAllocator(["a", "b"], batch_groups=2, config=BarConfig(group_size=4, first_round=2))
    first = allocator.next_requests()
    assert [(r.prompt_id, r.count) for r in first] == [("a", 2), ("b", 2)]
    assert allocator.next_requests() == []  # all in flight
    allocator.record("a", 1.0)
    allocator.record("a", 0.0)
    (again,) = allocator.next_requests()
    assert again.prompt_id == "a" and again.count >= 1


@pytest.mark.parametrize("seed", [0, 1])
def test_bar_spends_at_most_half_of_dapos_rollouts_per_informative_group_on_a_u_shape(seed):
    """A run of several epochs over a hard set: BAR's savings come from retiring what has no signal."""
    rates = hard_swe_pass_rates(500, seed=seed)
    config = BarConfig(group_size=8)
    tallies = {strategy: simulate_run(strategy, list(rates), coin_flips(rates, seed=seed), steps=24,
                                      batch_groups=16, config=config, seed=seed)
               for strategy in ("bar", "dapo", "fixed")}
    spent = {strategy: tally.rollouts_per_informative_group for strategy, tally in tallies.items()}
    assert tallies["bar"].informative_groups == tallies["dapo"].informative_groups == 24 * 16
    assert spent["bar"] <= 0.5 * spent["dapo"], spent


def test_history_retires_a_prompt_across_steps():
    history = PromptHistory()
    config = BarConfig(group_size=4, first_round=2, retire_after=4)
    first = BalancedAllocator(["never", "half"], batch_groups=2, config=config, history=history)
    first.next_requests()
    for _ in range(2):
        first.record("never", 0.0)
    assert not history.is_retired("never")
    history.get("never").negatives = 2  # as if the step had ended here
    second = drive(BalancedAllocator(["never"], batch_groups=1, config=config, history=history), lambda _: 0.0)
    assert second.stats().rollouts == 2 and history.is_retired("never")  # 2 + 2 earlier = retire_after
    third = BalancedAllocator(["never"], batch_groups=1, config=config, history=history)
    assert third.next_requests() == [] and third.done


def test_unknown_strategy_and_prompt_are_refused():
    with pytest.raises(ValueError, match="unknown rollout strategy"):
        make_allocator("ppo", ["a"], batch_groups=1)  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        BalancedAllocator(["a"], batch_groups=1).record("b", 1.0)


def test_a_task_that_showed_both_rewards_is_not_retired_for_the_run_by_one_unlucky_step():
    history = PromptHistory()
    config = BarConfig(group_size=2, retire_after=2, max_rollouts=4)
    rewards = iter([1.0, 0.0])
    drive(BalancedAllocator(["t"], batch_groups=1, config=config, history=history), lambda _: next(rewards))
    assert history.get("t").positives == 1 and history.get("t").negatives == 1
    unlucky = drive(BalancedAllocator(["t"], batch_groups=1, config=config, history=history), lambda _: 0.0)
    assert unlucky.retired() == {"t": "all_fail"} and not history.is_retired("t")  # this step only


def test_at_an_equal_budget_every_strategy_stays_within_it_and_the_simulated_policy_learns():
    """bench/rl_wasted_rollouts.py's comparison: runs stop before the step that would pass the budget, and
    the simulated policy's mean pass rate rises with the groups it trains on."""
    from orchard.recipes.bar.learning import learning_run

    rates = hard_swe_pass_rates(200, seed=3)
    for strategy, memory in (("bar", None), ("dapo", True), ("fixed", None)):
        run = learning_run(strategy, rates, budget=2048, batch_groups=8, config=BarConfig(group_size=8), lr=8.0,
                           seed=3, memory=memory)
        assert 1024 < run.tally.rollouts <= 2048, strategy
        assert run.final_reward > run.initial_reward and run.curve[-1][0] == run.tally.rollouts
