"""TRL's `rollout_func` for `GRPOTrainer`, with BAR deciding how many rollouts each prompt gets.

TRL hands the function a batch in which each prompt (here: a task id) appears `num_generations` (G) times
in a row and wants one completion per entry. For each such group the allocator (orchard.recipes.bar) runs
real rollouts (`RolloutEnv`) until it has its group — BAR: G/2 positive and G/2 negative rollouts, or fewer
balanced pairs at the budget, or none (retired: all-pass / all-fail); `fixed`: G rollouts; `dapo`: G
rollouts, dropped if they all agree. The chosen rollouts fill the group's slots; a slot nothing fills is a
placeholder (reward None, nothing trained), as is an infrastructure-error rollout, so neither moves the
group's mean or standard deviation. Rollouts run concurrently (the env's `parallel`), and a failing
rollout is recorded as an error of its prompt, never an exception of the step."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchard.core.task import Task
from orchard.recipes.bar import BarConfig, PromptHistory, Strategy, TrainingGroup, make_allocator
from orchard.recipes.rl_env import RolloutEnv
from orchard.recipes.rl_samples import RolloutSample, placeholder, reward_of, rollout_sample

log = logging.getLogger(__name__)


@dataclass
class StepReport:
    """What one step's rollouts did (the CLI prints it; `BarRolloutFunc.reports` keeps every step's)."""

    step: int
    rollouts: int = 0
    errors: int = 0
    groups: int = 0
    informative_groups: int = 0
    trained_tokens: int = 0
    env_tokens: int = 0
    placeholders: int = 0
    drifts: list[str] = field(default_factory=list)
    retired: dict[str, str] = field(default_factory=dict)
    rewards: dict[str, list[float | None]] = field(default_factory=dict)  # task id -> rewards of its slots
    rollout_log: list[dict[str, Any]] = field(default_factory=list)  # every rollout, chosen for training or not
    rollout_s: float = 0.0


@dataclass
class BarRolloutFunc:
    env: RolloutEnv
    tasks: dict[str, Task]
    pad_id: int
    strategy: Strategy = "bar"
    bar: BarConfig | None = None
    history: PromptHistory | None = field(default_factory=PromptHistory)
    on_step: Callable[[StepReport], None] | None = None
    reports: list[StepReport] = field(default_factory=list)
    last_output: dict[str, list] | None = None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        import time

        policy = self.env.policy
        if policy is not None and hasattr(policy, "model"):
            policy.model = trainer.accelerator.unwrap_model(trainer.model)  # the weights being trained
            policy.weights_changed()
        group_size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        report = StepReport(step=len(self.reports) + 1)
        started = time.monotonic()
        chunks = _groups(prompts, group_size)
        samples = self.env.call(self._run_groups(chunks, group_size, report))
        report.rollout_s = time.monotonic() - started
        self.reports.append(report)
        if self.on_step is not None:
            self.on_step(report)
        self.last_output = {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": [s.logprobs for s in samples],
            "env_mask": [s.env_mask for s in samples],
            "rollout_reward": [s.reward for s in samples],
            "task_id": [s.task_id for s in samples],
            "exit_status": [s.exit_status for s in samples],
        }
        return self.last_output

    async def _run_groups(self, chunks: list[tuple[str, list[int]]], group_size: int,
                          report: StepReport) -> list[RolloutSample]:
        config = (self.bar or BarConfig()).model_copy(update={"group_size": group_size})
        history = self.history if self.strategy == "bar" else None
        allocator = make_allocator(self.strategy, range(len(chunks)), batch_groups=len(chunks), config=config,
                                   history=_ChunkHistory(history, chunks) if history is not None else None,
                                   max_active=len(chunks))
        samples: dict[Any, RolloutSample] = {}
        running: set[asyncio.Task] = set()
        while True:
            for request in allocator.next_requests():
                task_id = chunks[request.prompt_id][0]
                for _ in range(request.count):
                    running.add(asyncio.ensure_future(self._one(request.prompt_id, self.tasks[task_id])))
            if not running:
                break
            finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for done in finished:
                chunk, sample = done.result()
                samples[sample.rollout_key] = sample
                report.rollouts += 1
                report.rollout_log.append({
                    "task_id": sample.task_id, "rollout_key": sample.rollout_key, "exit_status": sample.exit_status,
                    "reward": sample.reward, "model_calls": sample.calls, "sampled_tokens": sample.trained_tokens,
                    "environment_tokens": len(sample.env_mask) - sample.trained_tokens if sample.calls else 0,
                    "notes": sample.notes})
                if sample.reward is None:
                    report.errors += 1
                    allocator.record(chunk, rollout_id=sample.rollout_key,
                                     error="; ".join(sample.notes) or str(sample.exit_status))
                else:
                    allocator.record(chunk, sample.reward, rollout_id=sample.rollout_key)
                if sample.drift:
                    report.drifts.append(f"{sample.rollout_key}: {sample.drift}")
        groups = {group.prompt_id: group for group in allocator.groups()}
        report.retired = {chunks[c][0]: reason for c, reason in allocator.retired().items()}
        return self._fill(chunks, groups, samples, report)

    async def _one(self, chunk: int, task: Task) -> tuple[int, RolloutSample]:
        key = f"rl-{len(self.reports) + 1}-{chunk}-{uuid.uuid4().hex[:8]}"
        trajectory = await self.env.arollout(task, key)
        sample = rollout_sample(trajectory, self.pad_id)
        if sample.reward is None and reward_of(trajectory) is not None:
            log.warning("rollout %s recorded no token ids; masked", key)
        return chunk, sample

    def _fill(self, chunks: list[tuple[str, list[int]]], groups: dict[Any, TrainingGroup],
              samples: dict[Any, RolloutSample], report: StepReport) -> list[RolloutSample]:
        total = sum(len(positions) for _, positions in chunks)
        slots: list[RolloutSample | None] = [None] * total
        for chunk, (task_id, positions) in enumerate(chunks):
            group = groups.get(chunk)
            chosen = [samples[r.rollout_id] for r in group.rollouts] if group is not None else []
            chosen = [s for s in chosen if s.reward is not None]
            if group is not None:
                report.groups += 1
                report.informative_groups += group.informative
            for position, sample in zip(positions, chosen + [None] * len(positions)):
                if sample is None:
                    sample = placeholder(self.pad_id, task_id=task_id, note="slot not filled by the allocator")
                    report.placeholders += 1
                slots[position] = sample
            report.rewards[task_id] = [slots[p].reward for p in positions]
        filled = [s for s in slots if s is not None]
        report.trained_tokens = sum(s.trained_tokens for s in filled)
        report.env_tokens = sum(len(s.env_mask) - s.trained_tokens for s in filled if s.reward is not None)
        return filled


class _ChunkHistory(PromptHistory):
    """The run's history keyed by task id, seen by an allocator whose prompts are this batch's groups."""

    def __init__(self, history: PromptHistory, chunks: list[tuple[str, list[int]]]) -> None:
        super().__init__()
        self._history, self._chunks = history, chunks

    def get(self, prompt_id):
        return self._history.get(self._chunks[prompt_id][0])

    def is_retired(self, prompt_id) -> bool:
        return self._history.is_retired(self._chunks[prompt_id][0])

    def retired(self):
        return self._history.retired()


def _groups(prompts: list[Any], group_size: int) -> list[tuple[str, list[int]]]:
    """(task id, positions) of each run of `group_size` equal prompts (TRL repeats each prompt in a row)."""
    chunks = []
    for start in range(0, len(prompts), group_size):
        positions = list(range(start, min(start + group_size, len(prompts))))
        task_ids = {_task_id(prompts[p]) for p in positions}
        if len(task_ids) != 1:
            raise ValueError(f"rollout_func expects each prompt num_generations ({group_size}) times in a row; "
                             f"got {sorted(task_ids)} in one group")
        chunks.append((task_ids.pop(), positions))
    return chunks


def _task_id(prompt: Any) -> str:
    """The dataset's prompt is the task id (a string, or a one-message chat holding it)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content")
    return str(prompt)


def orchard_reward(prompts: list[Any], completions: list[Any], rollout_reward: list[float | None],
                   **_: Any) -> list[float | None]:
    """The grader's outcome of each rollout (None: nothing to score, left out of the group's statistics)."""
    return list(rollout_reward)
