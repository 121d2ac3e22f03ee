"""What the RL tests share: the tiny random Qwen3 as the policy, and dictated completions (`forced`) that
put known-good and known-bad actions into a group so that a GRPO step on a real task has a signal. The
dictated text's ids are scored by the model being trained, so ids and logprobs are still the policy's."""

from __future__ import annotations

import threading
from typing import Any

from orchard.core.errors import ModelError
from orchard.core.task import Task
from orchard.recipes.rl.guide import oracle_text

GIVE_UP = '<tool_call>\n{"name": "submit", "arguments": {"summary": "giving up"}}\n</tool_call>'


class Dictated:
    """Plays `roles[i]` for the i-th rollout key it sees: "solve" (the oracle), "fail" (submits at once),
    "error" (the model API fails: an infrastructure error), "sample" (the model samples)."""

    def __init__(self, task: Task, roles: list[str]) -> None:
        self.task, self.roles = task, roles
        self.seen: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, rollout_key: str | None, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None) -> str | None:
        with self._lock:
            role = self.seen.setdefault(rollout_key or "", self.roles[min(len(self.seen), len(self.roles) - 1)])
        if role == "error":
            raise ModelError("dictated failure: the model API is down")
        if role == "fail":
            return GIVE_UP
        if role == "solve":
            return oracle_text(self.task, messages, tools)
        return None
