"""Simulated RL runs for comparing rollout allocators (`orchard.recipes.bar`) without a model: each prompt
has a fixed pass rate, a rollout is a seeded coin flip (or an infrastructure error), and a run is several
training steps over a shuffled prompt set. Used by the tests and the wasted-rollouts benchmark.

`hard_swe_pass_rates` is the U shape of a hard SWE set for a mid-size policy: most tasks are never solved,
some always are, the rest spread towards both ends (Beta(0.5, 0.5))."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from orchard.recipes.bar.allocator import Allocator, drive
from orchard.recipes.bar.config import BarConfig, Strategy
from orchard.recipes.bar.records import PromptHistory
from orchard.recipes.bar.strategies import make_allocator


def hard_swe_pass_rates(count: int, *, seed: int = 0, never: float = 0.5, always: float = 0.1) -> dict[str, float]:
    rng = random.Random(seed)
    rates = {}
    for index in range(count):
        draw = rng.random()
        rates[f"task-{index}"] = (0.0 if draw < never else 1.0 if draw < never + always
                                  else rng.betavariate(0.5, 0.5))
    return rates


def coin_flips(rates: dict[Hashable, float], *, seed: int = 0,
               error_rate: float = 0.0) -> Callable[[Hashable], float | str]:
    rng = random.Random(seed)

    def rollout(prompt_id: Hashable) -> float | str:
        if error_rate and rng.random() < error_rate:
            return "sandbox_error: simulated infrastructure failure"
        return 1.0 if rng.random() < rates[prompt_id] else 0.0
    return rollout


@dataclass
class RunTally:
    strategy: str
    steps: int
    rollouts: int = 0
    informative_groups: int = 0
    trained_rollouts: int = 0
    errors: int = 0
    steps_run: int = 0
    signal_rollouts: int = 0  # trained rollouts in informative groups (a nonzero advantage)

    @property
    def rollouts_per_informative_group(self) -> float:
        return self.rollouts / self.informative_groups if self.informative_groups else float("inf")


def simulate_run(strategy: Strategy, prompts: list[Hashable], rollout: Callable[[Hashable], float | str], *,
                 steps: int, batch_groups: int, config: BarConfig, seed: int = 0,
                 memory: bool | None = None, budget: int | None = None,
                 on_step: Callable[[Allocator], None] | None = None) -> RunTally:
    """`steps` training steps, each drawing prompts from a reshuffled copy of `prompts` (one epoch after
    another) until its allocator is done. `memory` (default: on for BAR only) carries each prompt's
    history — and its retirement — from step to step. With `budget`, the run ends before the step that
    would take its rollouts past it (that step is not trained: every strategy spends at most `budget`).
    `on_step(allocator)` sees each step that is kept (e.g. to train a simulated policy on its groups)."""
    memory = strategy == "bar" if memory is None else memory
    history = PromptHistory() if memory else None
    rng = random.Random(seed)
    order: list[Hashable] = []
    tally = RunTally(strategy=strategy, steps=steps)
    for _ in range(steps):
        if len(order) < batch_groups * 8 * 4:
            epoch = list(prompts)
            rng.shuffle(epoch)
            order.extend(epoch)
        firsts = list(dict.fromkeys((prompt, None) for prompt in order))  # an allocator takes each once
        positions: dict[Hashable, int] = {}
        for position, prompt in enumerate(order):
            positions.setdefault(prompt, position)
        candidates = [prompt for prompt, _ in firsts]
        allocator = drive(make_allocator(strategy, candidates, batch_groups=batch_groups, config=config,
                                         history=history), rollout)
        used = allocator.stats()
        if used.groups == 0 and not allocator.drawn:
            break  # every prompt is retired
        if budget is not None and tally.rollouts + used.rollouts > budget:
            break
        if on_step is not None:
            on_step(allocator)
        consumed = {positions[prompt] for prompt in candidates[:allocator.drawn]}
        order = [prompt for position, prompt in enumerate(order) if position not in consumed]
        tally.rollouts += used.rollouts
        tally.informative_groups += used.informative_groups
        tally.trained_rollouts += used.trained_rollouts
        tally.errors += used.errors
        tally.steps_run += 1
        tally.signal_rollouts += used.signal_rollouts
    return tally
