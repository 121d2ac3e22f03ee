"""TRL's `rollout_func` for `GRPOTrainer`, with BAR deciding how many rollouts each prompt gets.

TRL hands the function a batch in which each prompt (here: a task id) appears `num_generations` (G) times
in a row and wants one completion per entry. For each such group the allocator (orchard.recipes.bar) runs
real rollouts (`RolloutEnv`) until it has its group — BAR: G/2 positive and G/2 negative rollouts, or fewer
balanced pairs at the budget, or none (retired: all-pass / all-fail); `fixed`: G rollouts; `dapo`: G
rollouts, dropped if they all agree. The chosen rollouts fill the group's slots. A task that gives no group
(retired now or in an earlier step: the run keeps one `PromptHistory`) is replaced by the next task of the
run's pool that is not retired (orchard.recipes.rl.task_pool), whose group fills those slots; a slot
nothing fills — the pool exhausted — is a placeholder (reward None, nothing trained), as is an
infrastructure-error rollout. Each sample carries its task's baseline: the mean and standard deviation of
every graded rollout of that task in the step (`baseline_mean`, `baseline_std`), from which
`OrchardGRPOTrainer` computes its advantage (orchard.recipes.rl.baseline). Rollouts run concurrently (the
env's `parallel`), and a failing rollout is recorded as an error of its prompt, never an exception of the
step."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchard.core.task import Task
from orchard.recipes.bar.config import BarConfig, Strategy
from orchard.recipes.bar.records import PromptHistory, TrainingGroup
from orchard.recipes.bar.strategies import make_allocator
from orchard.recipes.rl.baseline import MEAN_FIELD, STD_FIELD, TaskBaseline, task_baseline
from orchard.recipes.rl.env import RolloutEnv
from orchard.recipes.rl.offpolicy import GUIDED_FIELD
from orchard.recipes.rl.samples import RolloutSample, placeholder, reward_of, rollout_sample
from orchard.recipes.rl.task_pool import KeyedHistory, TaskPool

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
    replaced: dict[str, str] = field(default_factory=dict)  # batch task id -> the pool task trained instead
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
    replace: bool = True  # a task that gives no group is replaced by one from the pool (default: all `tasks`)
    reports: list[StepReport] = field(default_factory=list)
    last_output: dict[str, list] | None = None
    pool: TaskPool | None = None  # default: `tasks`, in order
    guided: Callable[[str], bool] | None = None  # rollout key -> a guide played it (off-policy)

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
        samples, baselines = self.env.call(self._run_groups(chunks, group_size, report))
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
            GUIDED_FIELD: [bool(self.guided and s.rollout_key and self.guided(s.rollout_key)) for s in samples],
            MEAN_FIELD: [b.mean if b is not None else None for b in baselines],
            STD_FIELD: [b.std if b is not None else None for b in baselines],
        }
        return self.last_output

    async def _run_groups(self, chunks: list[tuple[str, list[int]]], group_size: int, report: StepReport
                          ) -> tuple[list[RolloutSample], list[TaskBaseline | None]]:
        config = (self.bar or BarConfig()).model_copy(update={"group_size": group_size})
        history = self.history if self.strategy == "bar" else None
        batch = [task_id for task_id, _ in chunks]
        if self.pool is None:
            self.pool = TaskPool(self.tasks)
        candidates = self.pool.candidates(batch, history) if self.replace else []
        keys = batch + candidates  # the allocator's prompt i is task keys[i]: the batch first, then the pool
        allocator = make_allocator(self.strategy, range(len(keys)), batch_groups=len(chunks), config=config,
                                   history=KeyedHistory(history, keys) if history is not None else None,
                                   max_active=len(chunks))
        samples: dict[Any, RolloutSample] = {}
        graded: dict[int, list[float]] = {}  # every graded reward of each prompt this step: its baseline
        running: set[asyncio.Task] = set()
        while True:
            for request in allocator.next_requests():
                task = self.tasks[keys[request.prompt_id]]
                for _ in range(request.count):
                    running.add(asyncio.ensure_future(self._one(request.prompt_id, task)))
            if not running:
                break
            finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for done in finished:
                prompt, sample = done.result()
                samples[sample.rollout_key] = sample
                report.rollouts += 1
                report.rollout_log.append({
                    "task_id": sample.task_id, "rollout_key": sample.rollout_key, "exit_status": sample.exit_status,
                    "reward": sample.reward, "resolved": sample.resolved, "model_calls": sample.calls, "sampled_tokens": sample.trained_tokens,
                    "environment_tokens": len(sample.env_mask) - sample.trained_tokens if sample.calls else 0,
                    "notes": sample.notes})
                if sample.reward is None:
                    report.errors += 1
                    allocator.record(prompt, rollout_id=sample.rollout_key,
                                     error="; ".join(sample.notes) or str(sample.exit_status))
                else:
                    graded.setdefault(prompt, []).append(sample.reward)
                    allocator.record(prompt, sample.reward, rollout_id=sample.rollout_key)
                if sample.drift:
                    report.drifts.append(f"{sample.rollout_key}: {sample.drift}")
        self.pool.drew(candidates[:max(0, allocator.drawn - len(batch))])
        report.retired = {keys[p]: reason for p, reason in allocator.retired().items()}
        baselines = {prompt: task_baseline(rewards) for prompt, rewards in graded.items()}
        return self._fill(chunks, keys, allocator.groups(), samples, baselines, report)

    async def _one(self, chunk: int, task: Task) -> tuple[int, RolloutSample]:
        key = f"rl-{len(self.reports) + 1}-{chunk}-{uuid.uuid4().hex[:8]}"
        trajectory = await self.env.arollout(task, key)
        sample = rollout_sample(trajectory, self.pad_id)
        if sample.reward is None and reward_of(trajectory) is not None:
            log.warning("rollout %s recorded no token ids; masked", key)
        return chunk, sample

    def _fill(self, chunks: list[tuple[str, list[int]]], keys: list[str], groups: list[TrainingGroup],
              samples: dict[Any, RolloutSample], baselines: dict[int, TaskBaseline | None], report: StepReport
              ) -> tuple[list[RolloutSample], list[TaskBaseline | None]]:
        """Each chunk's slots: its own task's group, else the next replacement group, else placeholders."""
        own = {group.prompt_id: group for group in groups if group.prompt_id < len(chunks)}
        spare = [group for group in groups if group.prompt_id >= len(chunks)]
        total = sum(len(positions) for _, positions in chunks)
        slots: list[RolloutSample | None] = [None] * total
        slot_baselines: list[TaskBaseline | None] = [None] * total
        for chunk, (task_id, positions) in enumerate(chunks):
            group = own.get(chunk) or (spare.pop(0) if spare else None)
            chosen = [samples[r.rollout_id] for r in group.rollouts] if group is not None else []
            chosen = [s for s in chosen if s.reward is not None]
            trained_task = task_id
            if group is not None:
                report.groups += 1
                report.informative_groups += group.informative
                trained_task = keys[group.prompt_id]
                if group.prompt_id != chunk:
                    report.replaced[task_id] = trained_task
            for position, sample in zip(positions, chosen + [None] * len(positions)):
                if sample is None:
                    sample = placeholder(self.pad_id, task_id=trained_task,
                                         note="slot not filled: no task of the pool gave a group")
                    report.placeholders += 1
                else:
                    slot_baselines[position] = baselines.get(group.prompt_id)
                slots[position] = sample
            report.rewards[trained_task] = [slots[p].reward for p in positions]
        filled = [(s, b) for s, b in zip(slots, slot_baselines) if s is not None]
        report.trained_tokens = sum(s.trained_tokens for s, _ in filled)
        report.env_tokens = sum(len(s.env_mask) - s.trained_tokens for s, _ in filled if s.reward is not None)
        return [s for s, _ in filled], [b for _, b in filled]


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
