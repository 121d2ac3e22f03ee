"""The three allocators (plain GRPO's fixed groups, DAPO's dynamic sampling, BAR; see the package's
docstring) and `make_allocator`, which picks one by its strategy name."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

from orchard.recipes.bar.allocator import Allocator
from orchard.recipes.bar.config import BarConfig, Strategy
from orchard.recipes.bar.records import PromptHistory, PromptState, RolloutResult


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
