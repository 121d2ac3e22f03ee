"""Cross-harness distillation into a harness that renders its own prompts (`Dialect.captures_prompt`, e.g.
Kimi-CLI and OpenHands, which render them inside the sandbox from their bundle: Kimi's system prompt holds the
working directory's listing and the date, OpenHands' its tools' descriptions): they are not re-rendered here
but **captured**. The harness is run once per task with a policy whose first reply ends the run
(harness_replay.run_scripted), and the first request it sent — messages and tools, as the gateway received
them — is kept under `$ORCHARD_HOME/cache/harness-prompts/<harness>-<version>/<task>.json`
(orchard/core/captured_prompts.py), where the harness's dialect reads it back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchard.core.actions import UntranslatableCall
from orchard.core.captured_prompts import CapturedPrompt, load_prompt, save_prompt


async def capture_prompts(harness: str, task_ids: list[str], *, suite: str | Path = "swe-mini",
                          orchard_client: Any = None, home: Path | None = None, parallel: int = 2,
                          refresh: bool = False) -> dict[str, CapturedPrompt]:
    """The captured first request of `harness` for each task (run now where none is cached, or all with
    `refresh`); task id -> prompt."""
    from orchard.core.harness import get_harness
    from orchard.eval.suites import load_suite
    from orchard.recipes.translate.harness_replay import run_scripted

    version = get_harness(harness).version
    found = {} if refresh else {t: p for t in task_ids if (p := load_prompt(harness, version, t, home))}
    missing = sorted(set(task_ids) - set(found))
    if missing:
        run = await run_scripted(harness, {task_id: [] for task_id in missing}, suite=suite,
                                 orchard_client=orchard_client, parallel=parallel)
        tasks = load_suite(suite)
        for task_id in missing:
            if task_id not in run.first_requests:
                trajectory = run.trajectories.get(task_id)
                why = (trajectory.outcome.error if trajectory and trajectory.outcome else None) or "no model call"
                raise UntranslatableCall(f"{harness} sent no request for task {task_id!r} to capture: {why}")
            messages, tools = run.first_requests[task_id]
            prompt = CapturedPrompt(harness=harness, version=version, task_id=task_id,
                                    instruction=tasks.get(task_id).instruction, messages=messages, tools=tools)
            save_prompt(prompt, home)
            found[task_id] = prompt
    return found
