"""The part of a dialect (orchard/core/dialect.py) that harnesses whose prompts Orchard's process renders share
(react, mini-swe-agent): their first messages are a system and a task message rendered from their own
templates, and the task is read back out of a trajectory by rendering the task template with a sentinel
for each variable."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any


class TemplatedDialect(ABC):
    """A system and a task message, from the harness's templates; `tool_definitions` its tools."""

    ends_on_reply = False
    captures_prompt = False
    tool_definitions: list[dict[str, Any]]

    @abstractmethod
    def prompts(self, task_id: str, instruction: str, workdir: str) -> tuple[str, str]:
        """The system and the task message, as the harness renders them."""

    def initial_messages(self, task_id: str, instruction: str, workdir: str) -> tuple[list[dict[str, Any]],
                                                                                      list[dict[str, Any]]]:
        system, instance = self.prompts(task_id, instruction, workdir)
        return [{"role": "system", "content": system}, {"role": "user", "content": instance}], self.tool_definitions


def sentinel_regex(rendered: str, sentinels: dict[str, str]) -> re.Pattern[str]:
    """A template rendered with a sentinel for each variable, as a regex that captures each variable."""
    pattern = re.escape(rendered)
    for name, sentinel in sentinels.items():
        escaped = re.escape(sentinel)
        group = f"(?P<{name}>.*?)"
        pattern = pattern.replace(escaped, group, 1).replace(escaped, f"(?P={name})")
    return re.compile(r"\A" + pattern + r"\Z", re.S)
