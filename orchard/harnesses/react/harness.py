"""ReAct: Orchard's own generic tool-calling harness. The loop runs in Orchard's process; the model is
called through `ModelConfig.base_url` (the gateway) with OpenAI tools, and the tools run in the sandbox.

Each turn: one model call; each tool call it makes runs in order and its output goes back as a `tool`
message. The run ends when the model calls `submit`, when a limit is reached (a clean stop: outcome None,
`exit_status` names the limit), or when the model or the sandbox fails (Outcome(error=...), the trajectory
so far kept). The evaluator's deadline (`ModelConfig.deadline`) counts as a wall-time limit: the loop stops
before it with `time_limit` instead of being cut off."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from orchard.core.errors import BudgetExceeded, InvalidRequest, OrchardError, describe_validation_errors
from orchard.core.harness import ModelConfig, orchard_version
from orchard.core.sandbox import Sandbox
from orchard.core.run_status import ExitStatus
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Step, Trajectory
from orchard.harnesses.deadline import deadline_margin_s
from orchard.harnesses.mcp.toolset import McpCallFailed, McpToolset
from orchard.harnesses.openai_client import ChatClient, Completion, CompletionToolCall
from orchard.harnesses.react.config import ReActConfig
from orchard.harnesses.react.dialect import ReactDialect
from orchard.harnesses.react.prompts import render
from orchard.harnesses.react.tools import (TOOL_DEFINITIONS, SandboxCallFailed, SandboxTools, ToolResult,
                                           truncate_middle)
from orchard.harnesses.react.trajectory_builder import TrajectoryBuilder

NO_TOOL_CALL_MESSAGE = ("Your reply did not call a tool. Act through the tools (bash, view, create, "
                        "str_replace); when the task is done, call submit.")
AFTER_SUBMIT_MESSAGE = "Not run: submit was called earlier in this turn, which ended the task."


class ReActHarness:
    name = "react"
    version = orchard_version()
    mcp_tools = True  # a task's MCP tools are offered beside its own (orchard/harnesses/mcp/toolset.py)

    def __init__(self, config: ReActConfig | dict[str, Any] | None = None, **fields: Any) -> None:
        """`config` (a ReActConfig or its fields), with `fields` overriding it: `ReActHarness(step_limit=20)`."""
        base = config.model_dump() if isinstance(config, ReActConfig) else dict(config or {})
        try:
            self.config = ReActConfig.model_validate({**base, **fields})
        except ValidationError as exc:
            raise InvalidRequest(f"invalid react harness config: {describe_validation_errors(exc, 'config')}") from None

    def dialect(self) -> ReactDialect:
        """Its tools, prompts and result framing with this config, and the replay of its calls (dialect.py)."""
        return ReactDialect(self.config, version=self.version, no_tool_call_message=NO_TOOL_CALL_MESSAGE)

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        return await _Episode(self.config, task, sandbox, model).run()


class _Episode:
    """One run of the loop; holds what the run accumulates."""

    def __init__(self, config: ReActConfig, task: Task, sandbox: Sandbox, model: ModelConfig) -> None:
        self.config, self.task, self.model = config, task, model
        self.workdir = task.environment.workdir
        self.tools = SandboxTools(sandbox, self.workdir, command_timeout_s=config.command_timeout_s)
        self.mcp = McpToolset(task, sandbox)
        self.tool_definitions = TOOL_DEFINITIONS
        agent = Agent(name=ReActHarness.name, version=ReActHarness.version, model_name=model.model,
                      tool_definitions=TOOL_DEFINITIONS)
        self.builder = TrajectoryBuilder(agent, task_id=task.id, rollout_key=model.rollout_key)
        self.messages: list[dict[str, Any]] = []
        self.calls = 0
        self.tokens = 0
        self.started = time.monotonic()
        # Stop this long before the evaluator's deadline (a command's kill and the loop's return take time on a
        # busy machine; orchard/harnesses/deadline.py): the end is then the harness's to report.
        self.deadline_margin_s = deadline_margin_s(model.time_left_s() or 0.0)

    async def run(self) -> Trajectory:
        client = ChatClient(self.model)  # before anything runs: a config without base_url is a usage error
        exit_status, error = "", None
        try:
            await self.mcp.__aenter__()
        except (McpCallFailed, OrchardError) as exc:
            await client.aclose()
            return self._finish("environment_error", f"task {self.task.id}: its MCP tools could not be listed: {exc}")
        self.tool_definitions = TOOL_DEFINITIONS + self.mcp.definitions
        self.builder.trajectory.agent.tool_definitions = self.tool_definitions
        try:
            variables = {"instruction": self.task.instruction, "workdir": self.workdir, "task_id": self.task.id}
            self._say("system", render(self.config.system_template, **variables))
            self._say("user", render(self.config.instance_template, **variables))
            while not exit_status:
                exit_status = self._limit_reached()
                if exit_status:
                    break
                try:
                    completion = await client.complete(self.messages, tools=self.tool_definitions,
                                                       params=self.config.request_params)
                except BudgetExceeded:
                    exit_status = "budget_exhausted"  # the rollout's budget at the gateway: a limit, not a failure
                    break
                except OrchardError as exc:
                    exit_status, error = "model_error", f"model call failed: {exc}"
                    break
                try:
                    exit_status = await self._act(completion)
                except SandboxCallFailed as exc:
                    exit_status, error = "sandbox_error", str(exc)
        finally:
            await client.aclose()
            await self.mcp.__aexit__(None, None, None)
        return self._finish(exit_status, error)

    async def _act(self, completion: Completion) -> str:
        """Record the model's turn and run its tool calls; the exit status when the run ends here."""
        self.calls += 1
        self.tokens += completion.total_tokens
        step = self.builder.add_completion(completion, self.model.model)
        self.messages.append(completion.assistant_message())
        if not completion.tool_calls:
            self._say("user", NO_TOOL_CALL_MESSAGE)
            return ""
        submitted = False
        for call in completion.tool_calls:
            result = ToolResult(content=AFTER_SUBMIT_MESSAGE, is_error=True) if submitted else await self._run(call)
            content = truncate_middle(result.content, self.config.max_observation_chars)
            self.builder.observe(step, call.id, content, is_error=result.is_error, images=result.images)
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
            submitted = submitted or result.submitted
        return "submitted" if submitted else ""

    async def _run(self, call: CompletionToolCall) -> ToolResult:
        arguments, problem = call.parsed_arguments()
        if problem:
            return ToolResult(content=f"Error: invalid arguments for {call.name}: {problem}", is_error=True)
        if self.mcp.has(call.name):
            try:
                content, is_error, images = await self.mcp.call(call.name, arguments)
            except McpCallFailed as exc:
                return ToolResult(content=f"Error: {exc}", is_error=True)
            return ToolResult(content=content, is_error=is_error, images=images)
        return await self.tools.call(call.name, arguments, time_left_s=self._time_left())

    def _say(self, role: str, text: str) -> Step:
        self.messages.append({"role": role, "content": text})
        return self.builder.add_message(role, text)

    def _time_left(self) -> float | None:
        """Seconds left under the harness's own wall-time limit and the evaluator's deadline, whichever
        comes first (None: no limit)."""
        limit = self.config.wall_time_limit_s
        own = None if limit is None else limit - (time.monotonic() - self.started)
        deadline = self.model.time_left_s()
        if deadline is not None:
            deadline -= self.deadline_margin_s
        candidates = [left for left in (own, deadline) if left is not None]
        return min(candidates) if candidates else None

    def _limit_reached(self) -> str:
        if self.config.step_limit is not None and self.calls >= self.config.step_limit:
            return "step_limit"
        time_left = self._time_left()
        if time_left is not None and time_left <= 0:
            return "time_limit"
        if self.config.token_limit is not None and self.tokens >= self.config.token_limit:
            return "token_limit"
        return ""

    def _finish(self, exit_status: ExitStatus, error: str | None) -> Trajectory:
        trajectory = self.builder.trajectory
        trajectory.exit_status = exit_status
        if exit_status in LIMIT_NOTES:
            trajectory.notes = LIMIT_NOTES[exit_status].format(config=self.config, calls=self.calls,
                                                               tokens=self.tokens)
        if error is not None:
            trajectory.outcome = Outcome(error=error)
            trajectory.notes = error
        return self.builder.finish(wall_time_s=time.monotonic() - self.started)


LIMIT_NOTES = {
    "step_limit": "stopped: the step limit of {config.step_limit} model calls was reached",
    "time_limit": "stopped: out of time (the wall-time limit of {config.wall_time_limit_s} s, or the "
                  "evaluator's deadline for the task)",
    "token_limit": "stopped: {tokens} tokens used, the token limit is {config.token_limit}",
    "budget_exhausted": "stopped: the gateway refused further calls, this rollout's budget is used up",
}
