"""BAR's settings: the training group size and the knobs of the balanced allocator, and the strategy names."""

from __future__ import annotations

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
                                                       "all the prompt's rollouts (orchard.recipes.rl.baseline), "
                                                       "so an unbalanced group is not biased")
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
