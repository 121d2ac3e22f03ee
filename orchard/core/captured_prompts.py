"""The captured first request of a harness that renders its own prompts (Kimi-CLI's system prompt holds the
working directory's listing and the date, OpenHands' its tools' descriptions): what translation into that
harness starts from. The harness is run once per task with a policy whose first reply ends the run
(orchard/recipes/translate/captured.py), and the first request it sent — messages and tools, as the gateway
received them — is kept under `$ORCHARD_HOME/cache/harness-prompts/<harness>-<version>/<task>.json`, where
its dialect (`Dialect.captures_prompt`, orchard/core/dialect.py) reads it back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchard.core.home import resolve_home


class CapturedPrompt(BaseModel):
    """The first request a harness sent for a task."""

    harness: str
    version: str
    task_id: str
    instruction: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


def prompts_dir(home: Path | None = None) -> Path:
    return resolve_home(home) / "cache" / "harness-prompts"


def prompt_path(harness: str, version: str, task_id: str, home: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)
    return prompts_dir(home) / f"{harness}-{version}" / f"{safe}.json"


def load_prompt(harness: str, version: str, task_id: str, home: Path | None = None) -> CapturedPrompt | None:
    path = prompt_path(harness, version, task_id, home)
    return CapturedPrompt.model_validate_json(path.read_text()) if path.is_file() else None


def save_prompt(prompt: CapturedPrompt, home: Path | None = None) -> Path:
    path = prompt_path(prompt.harness, prompt.version, prompt.task_id, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(prompt.model_dump_json(indent=1))
    partial.replace(path)
    return path
