"""BAR — Balanced Adaptive Rollout: how many rollouts each prompt gets in GRPO-style RL, and which of them
form its training group. Pure Python (no torch): the same allocator drives `orchard train rl`, the
benchmark on simulated pass rates and any other rollout loop.

A group whose rollouts all got the same reward has zero advantage everywhere: its rollouts were spent for
nothing. Three allocators share one API, so they can be compared on the same prompts:

- `FixedGroupAllocator` — plain GRPO: `group_size` rollouts per prompt, every group kept (informative or
  not).
- `DynamicSamplingAllocator` — DAPO's zero-variance filter (dynamic sampling): `group_size` rollouts per
  prompt, groups whose rewards all agree are dropped, and further prompts are drawn until `batch_groups`
  informative groups are built.
- `BalancedAllocator` — BAR: each prompt is sampled in small rounds; it stops as soon as it holds
  `group_size // 2` positive and as many negative rollouts (the group is built from exactly those: equal
  positive and negative counts); a prompt whose rollouts all agree after `retire_after` rollouts is retired
  (all-pass or all-fail: no signal for this policy); a prompt that reaches `max_rollouts` with both rewards
  but not enough of one gives a group of every rollout of the scarcer reward filled up to `group_size`
  with the commoner one (Reinforce-Ada's fallback; `fill_group=False`: `min(pos, neg)` of each).

The loop is the same for all three:

    allocator = BalancedAllocator(prompt_ids, batch_groups=8, config=BarConfig(group_size=8))
    while not allocator.done:
        for request in allocator.next_requests():          # (prompt_id, how many rollouts)
            for _ in range(request.count):
                allocator.record(request.prompt_id, reward, rollout_id=handle)   # or error="..."
    groups = allocator.groups()                              # TrainingGroup: prompt_id + chosen rollouts

Across the steps of a run, BAR keeps a `PromptHistory`: a prompt retired as all-pass/all-fail is not drawn
again, and rollouts of earlier steps that agree count towards a prompt's retirement. That memory is where
most of the savings on a U-shaped pass-rate distribution come from, so bench/rl_wasted_rollouts.py compares
BAR with DAPO given the same memory, at an equal rollout budget.

The training group need not carry its own baseline: `graded(prompt_id)` is every reward the prompt got in
the step, which the advantage is centred on (orchard.recipes.rl_baseline).

A rollout that ended in an infrastructure error (the sandbox, the model API, the grader failed) is recorded
with `error=`: it is counted as spent, never as a reward (a fake 0 would bias the group's baseline). BAR
asks for a replacement; the fixed and DAPO allocators leave the group one rollout short, as GRPO
implementations mask such rollouts. A prompt with `max_errors` errors is retired as broken."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Strategy = Literal["bar", "dapo", "fixed"]
RetireReason = Literal["all_pass", "all_fail", "budget", "errors", "unused"]


class BarConfig(BaseModel):
    """The allocators' knobs; `group_size` is the training group size G (GRPO's num_generations)."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(default=8, ge=2, description="rollouts per training group (G)")
    first_round: int = Field(default=2, ge=1, description="BAR: rollouts of a prompt's first round")
    round_size: int = Field(default=4, ge=1, description="BAR: at most this many rollouts per later round")
    retire_after: int = Field(default=5, ge=1, description="BAR: retire a prompt whose first this-many rollouts "
                                                           "all got the same reward")
    max_rollouts: int | None = Field(default=None, ge=2, description="BAR: at most this many rollouts per prompt "
                                                                    "in a step (default: group_size, what DAPO "
                                                                    "spends, or retire_after if larger)")
    min_pairs: int = Field(default=1, ge=1, description="BAR: a prompt out of budget still gives a group if "
                                                        "it holds at least this many positives and negatives")
    fill_group: bool = Field(default=True, description="BAR: a prompt out of budget fills its group up to G with "
                                                       "the commoner reward (Reinforce-Ada's fallback) instead of "
                                                       "keeping min(pos, neg) pairs; the advantage's baseline is "
                                                       "all the prompt's rollouts (rl_baseline), so an unbalanced "
                                                       "group is not biased")
    max_errors: int = Field(default=3, ge=1, description="retire a prompt after this many infrastructure errors")
    positive_threshold: float = Field(default=0.5, description="a reward >= this is a positive rollout")

    @model_validator(mode="after")
    def _consistent(self) -> BarConfig:
        if self.max_rollouts is not None and self.max_rollouts < self.retire_after:
            raise ValueError(f"max_rollouts ({self.max_rollouts}) must be at least retire_after "
                             f"({self.retire_after})")
        return self

    @property
    def rollout_cap(self) -> int:
        """BAR's rollouts per prompt per step at most (`max_rollouts`, or its default)."""
        return self.max_rollouts if self.max_rollouts is not None else max(self.group_size, self.retire_after)

    @property
    def pairs(self) -> int:
        """Positive/negative pairs in a full balanced group."""
        return self.group_size // 2


@dataclass(frozen=True)
class RolloutRequest:
    prompt_id: Hashable
    count: int


@dataclass(frozen=True)
class RolloutResult:
    prompt_id: Hashable
    rollout_id: Hashable
    reward: float | None  # None: an infrastructure error
    error: str | None = None

    @property
    def is_error(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class TrainingGroup:
    """One prompt's rollouts chosen for training; `spent` counts every rollout the prompt cost (errors
    and unused ones included)."""

    prompt_id: Hashable
    rollouts: tuple[RolloutResult, ...]
    spent: int

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts if r.reward is not None]

    @property
    def informative(self) -> bool:
        """Its rewards differ: GRPO's advantages are not all zero."""
        rewards = self.rewards
        return len(rewards) >= 2 and max(rewards) > min(rewards)


@dataclass
class PromptState:
    prompt_id: Hashable
    results: list[RolloutResult] = field(default_factory=list)
    in_flight: int = 0
    closed: bool = False
    retired: RetireReason | None = None

    def valid(self) -> list[RolloutResult]:
        return [r for r in self.results if not r.is_error]

    @property
    def errors(self) -> int:
        return sum(r.is_error for r in self.results)


@dataclass
class PromptRecord:
    positives: int = 0
    negatives: int = 0
    retired: RetireReason | None = None


class PromptHistory:
    """What BAR remembers about each prompt across the steps of a run: its positive and negative rollouts
    so far and whether it was retired. A prompt whose rollouts all agreed over `retire_after` of them — in
    this step or in earlier ones — is retired for the rest of the run: the next epoch does not pay for it
    again. (Pass rates move as the policy learns; `revive` puts a prompt back, e.g. every few epochs.)"""

    def __init__(self) -> None:
        self._records: dict[Hashable, PromptRecord] = {}

    def get(self, prompt_id: Hashable) -> PromptRecord:
        return self._records.setdefault(prompt_id, PromptRecord())

    def is_retired(self, prompt_id: Hashable) -> bool:
        record = self._records.get(prompt_id)
        return record is not None and record.retired in ("all_pass", "all_fail", "errors")

    def revive(self, prompt_id: Hashable) -> None:
        self._records.pop(prompt_id, None)

    def retired(self) -> dict[Hashable, RetireReason]:
        return {p: r.retired for p, r in self._records.items()
                if r.retired in ("all_pass", "all_fail", "errors")}


class AllocatorStats(BaseModel):
    rollouts: int = Field(description="rollouts recorded (errors included)")
    errors: int
    prompts_used: int
    groups: int
    informative_groups: int
    retired: dict[str, int]
    trained_rollouts: int = Field(description="rollouts in the groups built")
    signal_rollouts: int = Field(default=0, description="rollouts in the informative groups built: the trained "
                                                        "rollouts with a nonzero advantage")

    @property
    def rollouts_per_informative_group(self) -> float:
        return self.rollouts / self.informative_groups if self.informative_groups else math.inf


class Allocator(ABC):
    """The shared machinery: prompts drawn in order, in-flight accounting, results, stats. Subclasses say
    how many rollouts a prompt needs next (`_wanted`) and when it is finished (`_settle`)."""

    strategy: Strategy

    def __init__(self, prompt_ids: Iterable[Hashable], *, batch_groups: int, config: BarConfig | None = None,
                 max_active: int | None = None, history: PromptHistory | None = None) -> None:
        if batch_groups < 1:
            raise ValueError(f"batch_groups must be at least 1, got {batch_groups}")
        self.config = config or BarConfig()
        self.batch_groups = batch_groups
        self.max_active = max_active or batch_groups
        self._pending = list(dict.fromkeys(prompt_ids))  # prompts not drawn yet, in order
        self._pending.reverse()
        self._states: dict[Hashable, PromptState] = {}
        self._active: list[PromptState] = []
        self._groups: list[TrainingGroup] = []
        self._next_rollout = 0
        self.history = history
        self.drawn = 0  # prompts taken from the list, retired ones skipped included

    # --- the loop ------------------------------------------------------------------------------------

    def next_requests(self) -> list[RolloutRequest]:
        """The rollouts to start now (beyond those in flight): one request per prompt that needs more."""
        self._fill_active()
        requests = []
        for state in self._active:
            count = self._wanted(state)
            if count > 0:
                state.in_flight += count
                requests.append(RolloutRequest(state.prompt_id, count))
        return requests

    def record(self, prompt_id: Hashable, reward: float | None = None, *, rollout_id: Hashable | None = None,
               error: str | None = None) -> RolloutResult:
        """One finished rollout of `prompt_id`: its reward, or `error` (an infrastructure failure; then
        `reward` must be None — it is not a result of the policy)."""
        state = self._states.get(prompt_id)
        if state is None:
            raise KeyError(f"prompt {prompt_id!r} was never requested by this allocator")
        if (error is None) == (reward is None):
            raise ValueError("record a rollout with either a reward or an error, not both or neither")
        if rollout_id is None:
            rollout_id = self._next_rollout
        self._next_rollout += 1
        result = RolloutResult(prompt_id, rollout_id, None if error is not None else float(reward), error)
        state.results.append(result)
        state.in_flight = max(0, state.in_flight - 1)
        if not state.closed:
            self._settle(state)
        return result

    @property
    def done(self) -> bool:
        """The batch is full, or no prompt is left that could add to it."""
        if len(self._groups) >= self.batch_groups:
            return True
        return not self._pending and all(s.closed for s in self._active)

    def groups(self) -> list[TrainingGroup]:
        """The groups built so far (at most `batch_groups`), in the order they finished."""
        return list(self._groups[:self.batch_groups])

    def retired(self) -> dict[Hashable, RetireReason]:
        return {s.prompt_id: s.retired for s in self._states.values() if s.retired is not None}

    def graded(self, prompt_id: Hashable) -> list[float]:
        """The reward of every rollout of `prompt_id` so far, errors left out (its advantage baseline)."""
        state = self._states.get(prompt_id)
        return [r.reward for r in state.valid()] if state is not None else []

    def stats(self) -> AllocatorStats:
        results = [r for s in self._states.values() for r in s.results]
        retired: dict[str, int] = {}
        for reason in self.retired().values():
            retired[reason] = retired.get(reason, 0) + 1
        groups = self.groups()
        return AllocatorStats(rollouts=len(results), errors=sum(r.is_error for r in results),
                              prompts_used=len(self._states), groups=len(groups),
                              informative_groups=sum(g.informative for g in groups), retired=retired,
                              trained_rollouts=sum(len(g.rollouts) for g in groups),
                              signal_rollouts=sum(len(g.rewards) for g in groups if g.informative))

    # --- helpers -------------------------------------------------------------------------------------

    def _fill_active(self) -> None:
        self._active = [s for s in self._active if not s.closed or s.in_flight]
        open_slots = self.batch_groups - len(self._groups)
        while (self._pending and open_slots > 0 and
               sum(not s.closed for s in self._active) < min(self.max_active, open_slots)):
            prompt_id = self._pending.pop()
            self.drawn += 1
            if self.history is not None and self.history.is_retired(prompt_id):
                continue
            state = PromptState(prompt_id)
            self._states[prompt_id] = state
            self._active.append(state)

    def _positive(self, result: RolloutResult) -> bool:
        return result.reward is not None and result.reward >= self.config.positive_threshold

    def _close(self, state: PromptState, group: list[RolloutResult] | None,
               retired: RetireReason | None = None) -> None:
        state.closed, state.retired = True, retired
        if self.history is not None:
            record = self.history.get(state.prompt_id)
            valid = state.valid()
            positives = sum(self._positive(r) for r in valid)
            record.positives += positives
            record.negatives += len(valid) - positives
            # retired for the run only while every rollout so far agreed: a task that has shown both
            # rewards stays in play after one unlucky step
            record.retired = retired if retired == "errors" or not (record.positives and record.negatives) \
                else None
        if group is not None and len(self._groups) < self.batch_groups:
            self._groups.append(TrainingGroup(state.prompt_id, tuple(group), spent=len(state.results)))
        elif group is not None:
            state.retired = "unused"  # the batch filled up while this prompt's rollouts ran

    @abstractmethod
    def _wanted(self, state: PromptState) -> int:
        """How many more rollouts `state`'s prompt needs now (each strategy decides)."""

    @abstractmethod
    def _settle(self, state: PromptState) -> None:
        """Close `state` once its rollouts say so: a group to train on, or retired."""


class FixedGroupAllocator(Allocator):
    """Plain GRPO: `group_size` rollouts per prompt, every group kept; an error leaves it one short."""

    strategy: Strategy = "fixed"

    def _wanted(self, state: PromptState) -> int:
        if state.closed:
            return 0
        return self.config.group_size - len(state.results) - state.in_flight

    def _settle(self, state: PromptState) -> None:
        if len(state.results) < self.config.group_size:
            return
        valid = state.valid()
        self._close(state, valid if valid else None, None if valid else "errors")


class DynamicSamplingAllocator(FixedGroupAllocator):
    """DAPO's dynamic sampling: fixed groups, zero-variance groups dropped, more prompts drawn instead."""

    strategy: Strategy = "dapo"

    def _settle(self, state: PromptState) -> None:
        if len(state.results) < self.config.group_size:
            return
        valid = state.valid()
        positives = sum(self._positive(r) for r in valid)
        if len(valid) >= 2 and 0 < positives < len(valid):
            self._close(state, valid)
        elif not valid:
            self._close(state, None, "errors")
        else:
            self._close(state, None, "all_pass" if positives else "all_fail")


class BalancedAllocator(Allocator):
    """BAR (see the module docstring)."""

    strategy: Strategy = "bar"

    def _wanted(self, state: PromptState) -> int:
        if state.closed:
            return 0
        config = self.config
        valid = state.valid()
        seen = len(valid) + state.in_flight
        left = config.rollout_cap - len(state.results) - state.in_flight
        if left <= 0:
            return 0
        if seen < config.first_round:
            return min(left, config.first_round - seen)
        if state.in_flight:
            return 0  # wait for the round in flight before deciding
        positives = sum(self._positive(r) for r in valid)
        negatives = len(valid) - positives
        if positives == 0 or negatives == 0:
            # no signal yet: sample up to the retirement check (earlier steps' rollouts count towards it)
            prior = self._prior(state, all_positive=positives > 0)
            return min(left, config.round_size, max(1, config.retire_after - prior - len(valid)))
        need_pos, need_neg = max(0, config.pairs - positives), max(0, config.pairs - negatives)
        rate = positives / len(valid)
        # rollouts expected to bring the scarcer class to `pairs`, at the observed pass rate
        expected = max(need_pos / max(rate, 1e-9) if need_pos else 0.0,
                       need_neg / max(1 - rate, 1e-9) if need_neg else 0.0)
        return max(1, min(left, config.round_size, math.ceil(expected)))

    def _settle(self, state: PromptState) -> None:
        config = self.config
        if state.errors >= config.max_errors:
            self._close(state, self._balanced(state, config.min_pairs), "errors")
            return
        valid = state.valid()
        positives = [r for r in valid if self._positive(r)]
        negatives = [r for r in valid if not self._positive(r)]
        if len(positives) >= config.pairs and len(negatives) >= config.pairs:
            self._close(state, positives[:config.pairs] + negatives[:config.pairs])
        elif (valid and (not positives or not negatives) and not state.in_flight and
              self._prior(state, all_positive=bool(positives)) + len(valid) >= config.retire_after):
            self._close(state, None, "all_fail" if not positives else "all_pass")
        elif len(state.results) >= config.rollout_cap and not state.in_flight:
            group = self._balanced(state, config.min_pairs, fill=config.fill_group)
            self._close(state, group, None if group else "budget")

    def _prior(self, state: PromptState, *, all_positive: bool) -> int:
        """Rollouts of earlier steps that agree with this step's so far (all positive or all negative):
        they count towards retirement only if the prompt never showed the other reward."""
        if self.history is None:
            return 0
        record = self.history.get(state.prompt_id)
        if all_positive:
            return record.positives if record.negatives == 0 else 0
        return record.negatives if record.positives == 0 else 0

    def _balanced(self, state: PromptState, at_least: int, *, fill: bool = False) -> list[RolloutResult] | None:
        valid = state.valid()
        positives = [r for r in valid if self._positive(r)]
        negatives = [r for r in valid if not self._positive(r)]
        pairs = min(len(positives), len(negatives), self.config.pairs)
        if pairs < at_least:
            return None
        if not fill:
            return positives[:pairs] + negatives[:pairs]
        # the scarcer reward's rollouts (up to G/2), then the commoner's up to G
        scarce, common = (positives, negatives) if len(positives) <= len(negatives) else (negatives, positives)
        taken = scarce[:self.config.pairs]
        return taken + common[:self.config.group_size - len(taken)]


def drive(allocator: Allocator, rollout: Callable[[Hashable], float | None | str]) -> Allocator:
    """Run `allocator` to the end synchronously, round by round: every request of a round is sampled
    (as parallel rollouts would be), then recorded. `rollout(prompt_id)` returns the reward, or a string
    (an infrastructure error's message). For simulations and tests; the RL loop runs rollouts in parallel."""
    while not allocator.done:
        requests = allocator.next_requests()
        if not requests:
            break  # nothing in flight and nothing wanted: every prompt is settled
        outcomes = [(request.prompt_id, rollout(request.prompt_id))
                    for request in requests for _ in range(request.count)]
        for prompt_id, outcome in outcomes:
            if isinstance(outcome, str):
                allocator.record(prompt_id, error=outcome)
            else:
                allocator.record(prompt_id, outcome)
    return allocator


ALLOCATORS: dict[Strategy, type[Allocator]] = {
    "bar": BalancedAllocator, "dapo": DynamicSamplingAllocator, "fixed": FixedGroupAllocator}


def make_allocator(strategy: Strategy, prompt_ids: Iterable[Hashable], *, batch_groups: int,
                   config: BarConfig | None = None, max_active: int | None = None,
                   history: PromptHistory | None = None) -> Allocator:
    try:
        cls = ALLOCATORS[strategy]
    except KeyError:
        raise ValueError(f"unknown rollout strategy {strategy!r}; choose from {', '.join(ALLOCATORS)}") from None
    return cls(prompt_ids, batch_groups=batch_groups, config=config, max_active=max_active, history=history)
