"""The oracle policy: a "model" that solves a task by playing its reference patch (SWE tasks) or its reference
solution (a script-graded task's shell command: Harbor's and claw-bench's solve.sh) through the harness's own
tools. An eval run with it checks the whole pipeline (harness, sandbox, patch extraction, grader) without a
real model: every task should come out resolved.

It is served as the model `oracle` (`OraclePolicy`, registered in the `orchard.models` entry-point group).
The evaluator calls its rollout hooks, in the gateway's process, around every rollout it serves:
`prepare_rollout(rollout_key, task)` registers the task for the rollout (`register`) before the harness
runs, `end_rollout(rollout_key)` forgets it afterwards (`unregister`). The oracle keeps no state per conversation: the
next action follows from how many oracle actions the request's `messages` already hold, so a retried or
replayed request gets the same answer. The plan:

1. apply the patch in the task's workdir (`git apply` of a quoted heredoc, or of base64 where the
   harness's text format could not carry the patch verbatim), or run the reference solution's command;
2. show what changed (`git status --short && git diff --stat`; for a reference solution, `ls -la`). The FAIL_TO_PASS tests are not run: they
   usually come with the grader's test patch, which the agent never sees, and pytest would leave caches in
   the working tree that the runner's `git add -A` would pick up as part of the agent's change;
3. submit: the `submit`-like tool if offered, else mini-swe-agent's `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`;
   a harness with tools but no submit tool that ran that command and asks again gets a reply without tool
   calls, which ends the turn where such a reply ends it (Kimi-CLI).

How each action is sent depends on the request's `tools`: a call of the shell tool (whatever its name and
argument), or, with no tools, one command block in the text format mini-swe-agent's text mode parses
(```mswea_bash_command, <mswea_bash_command>, or ```bash, read from the prompt)."""

from __future__ import annotations

import base64
import json
import re
import shlex
import threading
from dataclasses import dataclass
from typing import Any

from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.policy import Completion
from orchard.core.task import Task
from orchard.policies.own_messages import is_own_message, message_text
from orchard.policies.tool_specs import find_shell_tool, find_submit_tool, required_arguments, tool_specs

NAME = "oracle"
ORACLE_MARK = "[orchard oracle]"
TOOL_CALL_ID_PREFIX = "call_oracle_"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MINI_SWE_AGENT_SUBMIT = f"echo {SUBMIT_MARKER}"
SUBMIT_SUMMARY = "Applied the task's reference patch."
PLAN_LENGTH = 3

_tasks: dict[str, Task] = {}
_tasks_lock = threading.Lock()


# --- registry ---------------------------------------------------------------------------------------

def register(rollout_key: str, task: Task) -> None:
    """Let the oracle answer the calls of `rollout_key` by playing `task`'s reference patch."""
    _check_reference(task)  # refuse now, not at the first model call, a task the oracle cannot play
    if not rollout_key:
        raise InvalidRequest("the oracle needs a non-empty rollout key to register a task under")
    with _tasks_lock:
        _tasks[rollout_key] = task


def unregister(rollout_key: str) -> None:
    """Forget the task of `rollout_key` (nothing happens if none is registered)."""
    with _tasks_lock:
        _tasks.pop(rollout_key, None)


def registered_task(rollout_key: str | None) -> Task:
    with _tasks_lock:
        task = _tasks.get(rollout_key) if rollout_key else None
    if task is None:
        which = f"rollout {rollout_key!r}" if rollout_key else "a call without a rollout key"
        raise NotFound(f"the oracle has no task for {which}: call orchard.policies.oracle.register(rollout_key, "
                       "task) in the gateway's process before the harness runs, and send the rollout key with "
                       "every call (header X-Orchard-Rollout-Key or base URL /r/<key>/v1)")
    return task


# --- the policy ------------------------------------------------------------------------------------

class OraclePolicy:
    """The oracle as a Policy (orchard.core.policy), with the rollout hooks that tell it each rollout's task."""

    name = NAME
    description = "plays the task's reference patch through the harness's own tools (checks a pipeline)"
    blocking = False  # answers at once

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: dict[str, Any],
                 *, rollout_key: str | None, timeout_s: float | None) -> Completion:
        return respond(rollout_key, messages, tools)

    def prepare_rollout(self, rollout_key: str, task: Task) -> None:
        register(rollout_key, task)

    def end_rollout(self, rollout_key: str) -> None:
        unregister(rollout_key)


def respond(rollout_key: str | None, messages: list[dict[str, Any]],
            tools: list[dict[str, Any]] | None) -> Completion:
    """The next assistant message for the registered task of `rollout_key`."""
    return next_message(registered_task(rollout_key), messages, tools)


def next_message(task: Task, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Completion:
    done = sum(1 for message in messages
               if is_own_message(message, mark=ORACLE_MARK, call_id_prefix=TOOL_CALL_ID_PREFIX))
    step = min(done, PLAN_LENGTH - 1)  # after the plan: submit again (the harness did not stop)
    specs = tool_specs(tools)
    workdir = shlex.quote(task.environment.workdir)
    if not specs:
        return _text_reply(task, messages, step, workdir)
    shell = find_shell_tool(specs)
    submit = find_submit_tool(specs)
    if shell is None and not (step == PLAN_LENGTH - 1 and submit is not None):
        offered = ", ".join(spec.name for spec in specs)
        raise InvalidRequest(f"the oracle plays the reference patch through a shell tool, but the request's tools "
                             f"({offered}) have none that runs a command (like bash(command)); offer one, or "
                             "send no tools for the text format")
    if done >= PLAN_LENGTH and submit is None and _submit_output_came_back(messages):
        return _end_turn_reply()
    call_id = f"{TOOL_CALL_ID_PREFIX}{done}"
    solution = _reference_solution(task)
    if step == 0 and solution is not None:
        return _tool_reply(step, "run the reference solution", call_id, shell.name, shell.arguments(solution))
    if step == 0:
        return _tool_reply(step, "apply the reference patch", call_id, shell.name,
                           shell.arguments(_apply_command(_reference_patch(task), workdir, heredoc=True)))
    if step == 1:
        return _tool_reply(step, "check the change", call_id, shell.name,
                           shell.arguments(_check_command(workdir, git=solution is None)))
    if submit is not None:
        return _tool_reply(step, "submit", call_id, submit.name, required_arguments(submit, SUBMIT_SUMMARY))
    return _tool_reply(step, "submit", call_id, shell.name, shell.arguments(MINI_SWE_AGENT_SUBMIT))


# --- actions ---------------------------------------------------------------------------------------

def _reference_solution(task: Task) -> str | None:
    """A script-graded task's reference solution (a shell command run in the workdir), if it has one."""
    solution = getattr(task.grader, "reference_solution", None)
    return solution if solution and solution.strip() else None


def _reference_patch(task: Task) -> str:
    patch = getattr(task.grader, "reference_patch", None)
    if not patch or not patch.strip():
        raise InvalidRequest(f"task {task.id!r} has neither a reference patch nor a reference solution, so the "
                             "oracle cannot play it; use the oracle only with SWE tasks that carry their gold "
                             "patch, or tasks whose grader has a reference_solution (Harbor's and claw-bench's "
                             "solve.sh)")
    return patch


def _check_reference(task: Task) -> None:
    if _reference_solution(task) is None:
        _reference_patch(task)


def _apply_command(patch: str, workdir: str, *, heredoc: bool) -> str:
    if heredoc:
        delimiter = "ORCHARD_PATCH_EOF"
        while delimiter in patch:
            delimiter += "_X"
        body = patch if patch.endswith("\n") else patch + "\n"
        return f"cd {workdir} && git apply -v <<'{delimiter}'\n{body}{delimiter}"
    encoded = base64.b64encode(patch.encode()).decode()
    return f"cd {workdir} && printf '%s' '{encoded}' | base64 -d | git apply -v"


def _check_command(workdir: str, *, git: bool = True) -> str:
    return f"cd {workdir} && git status --short && git diff --stat" if git else f"cd {workdir} && ls -la"


def _submit_output_came_back(messages: list[dict[str, Any]]) -> bool:
    """Whether the last message is the submit command's output as a tool result: the harness ran it and did
    not stop, so it does not follow mini-swe-agent's submit convention."""
    last = messages[-1] if messages else {}
    return last.get("role") == "tool" and any(line.strip() == SUBMIT_MARKER  # harnesses may wrap the output
                                              for line in message_text(last.get("content")).splitlines())


def _end_turn_reply() -> Completion:
    """For a harness with tools but no submit tool that ran the submit command and asked again: a reply with
    no tool calls, which ends the turn where such a reply ends it (Kimi-CLI)."""
    return Completion(message={"role": "assistant", "content": f"{ORACLE_MARK} Done: {SUBMIT_SUMMARY}"},
                      finish_reason="stop", model=NAME)


def _thought(step: int, what: str) -> str:
    return f"{ORACLE_MARK} Step {step + 1} of {PLAN_LENGTH}: {what}."


def _tool_reply(step: int, what: str, call_id: str, name: str, arguments: dict[str, Any]) -> Completion:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return Completion(message={"role": "assistant", "content": _thought(step, what), "tool_calls": [call]},
                      finish_reason="tool_calls", model=NAME)


# --- the text format (no tools) --------------------------------------------------------------------

@dataclass(frozen=True)
class TextActionFormat:
    opening: str
    closing: str

    def wrap(self, command: str) -> str:
        return f"{self.opening}\n{command}\n{self.closing}"

    def carries(self, text: str) -> bool:
        """Whether `text` survives inside one block (a non-greedy regex ends the block at the first closing)."""
        return self.closing not in text and self.opening not in text


MSWEA_FENCE = TextActionFormat("```mswea_bash_command", "```")  # mini-swe-agent >= 2 text mode
MSWEA_XML = TextActionFormat("<mswea_bash_command>", "</mswea_bash_command>")
BASH_FENCE = TextActionFormat("```bash", "```")  # mini-swe-agent 1.x and most other text-mode agents
_FENCE_LABEL = re.compile(r"```(bash|sh|shell|mswea_bash_command)[ \t]*\n")


def text_action_format(messages: list[dict[str, Any]]) -> TextActionFormat:
    """The command block the harness's prompt asks for (system and user messages), ```bash if it shows none."""
    prompt = "\n".join(message_text(m.get("content")) for m in messages
                       if m.get("role") in ("system", "developer", "user"))
    if MSWEA_XML.opening in prompt:
        return MSWEA_XML
    match = _FENCE_LABEL.search(prompt)
    if match is None:
        return BASH_FENCE
    return MSWEA_FENCE if match.group(1) == "mswea_bash_command" else TextActionFormat(f"```{match.group(1)}", "```")


def _text_reply(task: Task, messages: list[dict[str, Any]], step: int, workdir: str) -> Completion:
    form = text_action_format(messages)
    solution = _reference_solution(task)
    if step == 0 and solution is not None and form.carries(solution):
        command, what = solution, "run the reference solution"
    elif step == 0 and solution is not None:
        encoded = base64.b64encode(solution.encode()).decode()
        command, what = f"printf '%s' '{encoded}' | base64 -d | bash", "run the reference solution"
    elif step == 0:
        patch = _reference_patch(task)
        command = _apply_command(patch, workdir, heredoc=form.carries(patch))
        what = "apply the reference patch"
    elif step == 1:
        command, what = _check_command(workdir, git=solution is None), "check the change"
    else:
        command, what = MINI_SWE_AGENT_SUBMIT, "submit"
    content = f"THOUGHT: {_thought(step, what)}\n\n{form.wrap(command)}"
    return Completion(message={"role": "assistant", "content": content}, finish_reason="stop", model=NAME)
