"""Guided rollouts for GRPO: a share of a task's rollouts plays the oracle's replies (the task's reference
patch through the harness's own tools) instead of sampling them, so that a group holds a success even where
the policy never solves the task — without one, every reward in the group is the same, every advantage is
zero and GRPO learns nothing (BAR retires such a task).

A guided rollout is still the policy's in the token sense: the guide dictates the *text* of each reply
(`TrainingPolicy.forced`), and the policy scores those tokens with its own weights, so the trainer gets ids
and logprobs of the model being trained and the gradient raises the probability of the successful actions.
It is off-policy data (the replies were not sampled), as in mixed-policy GRPO (e.g. LUFFY); the rewards are
still the grader's. Which rollouts are guided is decided per task by arrival: with `every=2`, the second,
fourth, … rollout of each task is guided, the others sampled.

    guide = OracleGuide(tasks, every=2)
    train_rl(config, forced=guide)   # or RLConfig(guide="oracle"); guide.role(rollout_key) says which"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from orchard.core.task import Task
from orchard.policies import oracle
from orchard.policies.chat_render import content_text

GUIDED, SAMPLED = "guided", "sampled"


def oracle_text(task: Task, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The oracle's next reply as the text a Hermes-format policy writes: its words, then one
    `<tool_call>` block per call (what `orchard.policies.tool_parsing` reads back)."""
    reply = oracle.next_message(task, messages, tools).message
    parts = [reply.get("content") or ""]
    for call in reply.get("tool_calls") or []:
        function = call["function"]
        parts.append("<tool_call>\n" + json.dumps({"name": function["name"],
                                                   "arguments": json.loads(function["arguments"])}) + "\n</tool_call>")
    return "\n".join(part for part in parts if part)


class OracleGuide:
    """`TrainingPolicy.forced`: the oracle's replies for every `every`-th rollout of each task, None (sample)
    for the others. The task of a call is the one whose instruction its first user message holds."""

    def __init__(self, tasks: Iterable[Task], every: int = 2) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1 (1: guide every rollout), got {every}")
        self.tasks, self.every = list(tasks), every
        self._roles: dict[str, str] = {}  # rollout key -> GUIDED / SAMPLED
        self._counts: dict[str, int] = {}  # task id -> rollouts seen
        self._lock = threading.Lock()

    def __call__(self, rollout_key: str | None, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None) -> str | None:
        task = self.task_of(messages)
        if task is None:
            return None
        with self._lock:
            role = self._roles.get(rollout_key or "")
            if role is None:
                seen = self._counts.get(task.id, 0)
                self._counts[task.id] = seen + 1
                role = GUIDED if seen % self.every == self.every - 1 else SAMPLED
                if rollout_key:
                    self._roles[rollout_key] = role
        return oracle_text(task, messages, tools) if role == GUIDED else None

    def task_of(self, messages: list[dict[str, Any]]) -> Task | None:
        first = next((m for m in messages if m.get("role") == "user"), None)
        text = content_text(first.get("content")) if first else ""
        matches = [task for task in self.tasks if task.instruction.strip() and task.instruction.strip() in text]
        return max(matches, key=lambda task: len(task.instruction)) if matches else None

    def role(self, rollout_key: str) -> str:
        """GUIDED or SAMPLED (a rollout the guide has not seen was sampled)."""
        with self._lock:
            return self._roles.get(rollout_key, SAMPLED)
