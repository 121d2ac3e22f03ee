"""The suite's model: a policy served by the run's gateway (as the model `orchard/<this module>:ConformanceModel`)
that plays a fixed plan per scenario through whatever tools the harness offers. It stands in for a model
only, so that what a harness does with the replies can be checked; like the oracle (orchard/policies/oracle.py,
whose tool discovery and text format it uses) it keeps no state per conversation: the next reply follows from
how many of its own replies the request's messages already hold, and the scenario from the task the
evaluator's rollout hook registers.

Every reply carries token ids and logprobs (one byte a token, each logprob `LOGPROB`), as a vLLM server asked
for them returns them, so the suite can check that they reach the trajectory."""

from __future__ import annotations

import json
import threading
from typing import Any

from orchard.core.errors import InvalidRequest, ModelError
from orchard.core.policy import Completion, TokenLogprob
from orchard.core.task import Task
from orchard.policies.oracle import MINI_SWE_AGENT_SUBMIT, text_action_format
from orchard.policies.own_messages import is_own_message
from orchard.policies.tool_specs import find_shell_tool, find_submit_tool, required_arguments, tool_specs
from orchard.testing.harness_conformance.scenarios import (DEADLINE, MODEL_ERROR, SCENARIO_KEY, SOLVE, SOLVE_COMMAND,
                                                           STALL_COMMAND)
from orchard.testing.scripted_script import byte_token_text, byte_tokens, render_prompt

MODEL_PATH = f"{__name__}:ConformanceModel"
MARK = "[orchard harness conformance]"
CALL_ID_PREFIX = "call_conformance_"
LOGPROB = -0.0625  # exact in binary: a recorded value equals it, not just approximately
MODEL_ERROR_TEXT = "the conformance model fails this rollout on purpose (scenario model_error)"


class ConformanceModel:
    """A Policy with rollout hooks (orchard.core.policy), for the harness conformance suite only."""

    name = "harness-conformance"
    description = "plays the harness conformance suite's scenarios (a stand-in for a model)"
    blocking = False  # answers at once

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scenarios: dict[str, str] = {}

    def prepare_rollout(self, rollout_key: str, task: Task) -> None:
        scenario = task.metadata.get(SCENARIO_KEY)
        if scenario not in (SOLVE, DEADLINE, MODEL_ERROR):
            raise InvalidRequest(f"task {task.id!r} is not a harness conformance task (metadata "
                                 f"{SCENARIO_KEY!r} is {scenario!r})")
        with self._lock:
            self._scenarios[rollout_key] = scenario

    def end_rollout(self, rollout_key: str) -> None:
        with self._lock:
            self._scenarios.pop(rollout_key, None)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: dict[str, Any],
                 *, rollout_key: str | None, timeout_s: float | None) -> Completion:
        with self._lock:
            scenario = self._scenarios.get(rollout_key or "")
        if scenario is None:
            raise InvalidRequest(f"the conformance model has no scenario for rollout {rollout_key!r}: it answers "
                                 "only rollouts the evaluator prepared (run it through the suite)")
        if scenario == MODEL_ERROR:
            raise ModelError(MODEL_ERROR_TEXT)
        done = sum(1 for message in messages if is_own_message(message, mark=MARK, call_id_prefix=CALL_ID_PREFIX))
        message = _reply(scenario, done, messages, tools)
        return _with_tokens(message, messages, tools)


def _reply(scenario: str, done: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
           ) -> dict[str, Any]:
    """The next assistant message: the solve plan (write the file, then submit) or the stall (a command that
    outlasts any deadline, again and again)."""
    if scenario == DEADLINE:
        return _command(STALL_COMMAND, done, messages, tools, "wait for something that never comes")
    if done == 0:
        return _command(SOLVE_COMMAND, done, messages, tools, "write the file")
    specs = tool_specs(tools)
    submit = find_submit_tool(specs)
    if submit is not None:
        return _tool_message(done, "submit", submit.name, required_arguments(submit, "Wrote hello.txt."))
    if done >= 2:  # the harness ran the submit command and asked again: a reply without tool calls ends its turn
        return {"role": "assistant", "content": f"{MARK} Done: hello.txt holds hello."}
    return _command(MINI_SWE_AGENT_SUBMIT, done, messages, tools, "submit")


def _command(command: str, done: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             what: str) -> dict[str, Any]:
    specs = tool_specs(tools)
    if not specs:  # the text format: one command block, as the harness's prompt asks for it
        form = text_action_format(messages)
        return {"role": "assistant", "content": f"THOUGHT: {MARK} {what}.\n\n{form.wrap(command)}"}
    shell = find_shell_tool(specs)
    if shell is None:
        offered = ", ".join(spec.name for spec in specs)
        raise InvalidRequest(f"the conformance model acts through a shell tool, but the harness offered none that "
                             f"runs a command (like bash(command)) among {offered}")
    return _tool_message(done, what, shell.name, shell.arguments(command))


def _tool_message(done: int, what: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {"id": f"{CALL_ID_PREFIX}{done}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": f"{MARK} {what}.", "tool_calls": [call]}


def _with_tokens(message: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                 ) -> Completion:
    completion = byte_tokens(json.dumps(message, sort_keys=True))
    return Completion(message=message, finish_reason="tool_calls" if message.get("tool_calls") else "stop",
                      prompt_token_ids=byte_tokens(render_prompt(messages, tools)), completion_token_ids=completion,
                      logprobs=[TokenLogprob(token_id=token, text=byte_token_text(token), logprob=LOGPROB, top=[])
                                for token in completion])
