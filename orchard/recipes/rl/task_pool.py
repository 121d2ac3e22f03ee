"""The run's task pool, from which the rollout function draws a replacement when a task of TRL's batch gives
no group (BAR retired it, DAPO dropped it, or it was retired in an earlier step): the step then trains full
groups as long as the pool has tasks that are not retired, and placeholders fill slots only when it has
none. This is what `orchard.recipes.bar.simulation` (and the wasted-rollouts bench) measure: one prompt
history for the run, further prompts drawn until the batch is full.

Replacement candidates rotate: the pool is the run's tasks in order; those a step drew go to its end, so
every task gets its turn before one comes back."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from orchard.recipes.bar.records import PromptHistory


class TaskPool:
    def __init__(self, task_ids: Iterable[str]) -> None:
        self._order = list(dict.fromkeys(task_ids))

    def candidates(self, batch: Iterable[str], history: PromptHistory | None) -> list[str]:
        """Replacement candidates for a batch, in turn: not in the batch, not retired for the run."""
        taken = set(batch)
        return [t for t in self._order
                if t not in taken and (history is None or not history.is_retired(t))]

    def drew(self, task_ids: Iterable[str]) -> None:
        """These candidates were drawn (used or skipped): they go to the back of the line."""
        drawn = set(task_ids)
        self._order = [t for t in self._order if t not in drawn] + [t for t in self._order if t in drawn]


class KeyedHistory(PromptHistory):
    """The run's history keyed by task id, seen by an allocator whose prompt ids are positions in `keys`
    (this step's batch tasks, then the replacement candidates; a task may repeat in TRL's batch)."""

    def __init__(self, history: PromptHistory, keys: list[str]) -> None:
        super().__init__()
        self._history, self._keys = history, keys

    def get(self, prompt_id: Hashable):
        return self._history.get(self._keys[prompt_id])

    def is_retired(self, prompt_id: Hashable) -> bool:
        return self._history.is_retired(self._keys[prompt_id])

    def revive(self, prompt_id: Hashable) -> None:
        self._history.revive(self._keys[prompt_id])

    def retired(self):
        return self._history.retired()
