"""What the allocators keep: the rollouts asked for and recorded, the groups built, each prompt's state in a
step, BAR's memory of prompts across the steps of a run (`PromptHistory`), and the counts of a step."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from orchard.recipes.bar.config import RetireReason


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
