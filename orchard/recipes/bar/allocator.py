"""The machinery the three allocators share (`Allocator`): prompts drawn in order, in-flight accounting,
results, groups, stats; and `drive`, which runs one to the end for a function (simulations, tests)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable

from orchard.recipes.bar.config import BarConfig, RetireReason, Strategy
from orchard.recipes.bar.records import (AllocatorStats, PromptHistory, PromptState, RolloutRequest, RolloutResult,
                                         TrainingGroup)


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
