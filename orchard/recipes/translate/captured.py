"""Cross-harness distillation into the harnesses that run inside the sandbox (Kimi-CLI, OpenHands): their
prompts are rendered by the harness itself, in its own bundle (Kimi's system prompt holds the working
directory's listing and the date, OpenHands' its tools' descriptions), so they are not re-rendered here but
**captured**: the harness is run once per task with a policy whose first reply ends the run
(harness_replay.run_scripted), and the first request it sent — messages and tools, as the gateway
received them — is kept under `$ORCHARD_HOME/cache/harness-prompts/<harness>-<version>/<task>.json`.

`CapturedDialect` is the dialect of such a harness: its first messages and tools from the capture of the
trajectory's task, tool results written as the harness writes them (Kimi: a `<system>` status part and the
output; OpenHands' terminal: the output and its exit-code lines), and no nudge after a reply without tool
calls: such a reply ends the run there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchard.core.trajectory import ObservationResult, Trajectory
from orchard.recipes.translate.actions import UntranslatableCall
from orchard.recipes.translate.conversation import Observed, TaskText, _first_user_message, _text

CAPTURED_HARNESSES = ("kimi-cli", "openhands")
KIMI_STATUS = re.compile(r"\A<system>(ERROR: )?(.*?)</system>", re.S)
KIMI_FAILED = re.compile(r"Command failed with exit code: (-?\d+)\.")
OPENHANDS_TAIL = re.compile(r"\n?\[The command completed with exit code (-?\d+)\.\](?:\n\[[^\n]*\])*\s*\Z", re.S)
OPENHANDS_FINISHED = re.compile(r"\[Command finished with exit code (-?\d+)\]\s*\Z")


class CapturedPrompt(BaseModel):
    """The first request a harness sent for a task: what translation into that harness starts from."""

    harness: str
    version: str
    task_id: str
    instruction: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


def prompts_dir(home: Path | None = None) -> Path:
    from orchard.sandbox.backends.local import orchard_home

    return (home or orchard_home()) / "cache" / "harness-prompts"


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


class CapturedDialect:
    """The dialect of Kimi-CLI or OpenHands (see the module docstring)."""

    ends_on_reply = True  # a reply without tool calls ends the run

    def __init__(self, harness: str, home: Path | None = None) -> None:
        from orchard.core.harness import get_harness

        self.name, self.home = harness, home
        self.version = get_harness(harness).version
        self.tool_definitions: list[dict[str, Any]] = []
        self.workdir = "/testbed"

    def initial_messages(self, task_id: str, instruction: str, workdir: str) -> tuple[list[dict[str, Any]],
                                                                                       list[dict[str, Any]]]:
        prompt = load_prompt(self.name, self.version, task_id, self.home)
        if prompt is None:
            raise UntranslatableCall(
                f"no captured prompt of {self.name} {self.version} for task {task_id!r}: capture it first "
                "(orchard.recipes.translate.captured.capture_prompts; `orchard train sft --target-harness` does)")
        if prompt.instruction.strip() != instruction.strip():
            raise UntranslatableCall(f"task {task_id!r}: the rollout's task text is not the one {self.name}'s prompt "
                                     "was captured with (another version of the suite?); capture it again")
        self.workdir = workdir
        return [dict(m) for m in prompt.messages], prompt.tools

    def read_task(self, trajectory: Trajectory) -> TaskText:
        return TaskText(_first_user_message(trajectory).strip(), None)

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = _text(result)
        if self.name == "kimi-cli":
            status = KIMI_STATUS.match(text)
            if status is None:
                return Observed(text, 0)
            output = text[status.end():]
            failed = KIMI_FAILED.search(status.group(2))
            if failed:
                return Observed(output, int(failed.group(1)))
            return Observed(output, 1 if status.group(1) else 0)
        finished = OPENHANDS_FINISHED.search(text)
        tail = OPENHANDS_TAIL.search(text)
        if function_name == "terminal" and (tail or finished):
            code = int((tail or finished).group(1))
            return Observed(text[:tail.start()] + "\n" if tail else text, code)
        return Observed(text, 1 if text.startswith("ERROR") else 0)

    def result_text(self, function_name: str, observed: Observed) -> str:
        return "".join(part["text"] for part in self._parts(function_name, observed))

    def _parts(self, function_name: str, observed: Observed) -> list[dict[str, str]]:
        if self.name == "kimi-cli":
            if function_name == "Shell":
                status = ("Command executed successfully." if observed.returncode == 0 else
                          f"ERROR: Command failed with exit code: {observed.returncode}.")
            else:
                status = "ERROR: the tool failed." if observed.returncode else ""
            parts = [f"<system>{status}</system>"] if status else []
            parts += [observed.output] if observed.output else []
            return [{"type": "text", "text": part} for part in parts or ["<system>Tool output is empty.</system>"]]
        text = observed.output
        if function_name == "terminal":
            code = observed.returncode
            text = (f"{text.rstrip(chr(10))}\n[The command completed with exit code {code}.]\n"
                    f"[Current working directory: {self.workdir}]\n[Command finished with exit code {code}]")
        return [{"type": "text", "text": text}]

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        messages = []
        for call_id, name, observed in calls:
            message: dict[str, Any] = {"role": "tool", "content": self._parts(name, observed), "tool_call_id": call_id}
            if self.name == "openhands":
                message["name"] = name
            messages.append(message)
        return messages

    def no_tool_call_message(self) -> str | None:
        return None
