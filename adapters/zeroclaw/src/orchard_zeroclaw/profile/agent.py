"""The profile's agent loop, in Orchard's process: ZeroClaw's tool-call loop for one turn (the task is the one
message), the model reached only through `ModelConfig.base_url` (the gateway) and the tools run in the
sandbox.

Each iteration: the history cap (history.py), one model call with the tools, then the reply's tool calls one
after the other (ZeroClaw's `parallel_tools` is off), each result back as a `tool` message. A reply without
tool calls ends the turn, and with it the run (`submitted`), as ZeroClaw's turn ends; `delegate` runs a
sub-agent the same way (`Run.delegate`), whose trajectory goes into `subagent_trajectories`.

How a run ends: `submitted`; a limit (`step_limit`, `time_limit` — the harness's own wall time or the
evaluator's deadline, stopped a margin before it — `budget_exhausted`), the steps kept and graded; or an error
kept apart from the agent's attempts: `model_error`, `sandbox_error`, `environment_error` (the task's MCP tools
could not be listed)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from orchard.core.errors import BudgetExceeded, OrchardError
from orchard.core.harness import ModelConfig
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Outcome, Trajectory
from orchard.harnesses.deadline import deadline_margin_s
from orchard.harnesses.mcp.toolset import McpCallFailed, McpToolset
from orchard.harnesses.openai_client import ChatClient, Completion, CompletionToolCall

from orchard_zeroclaw.profile.builder import StepsBuilder
from orchard_zeroclaw.profile.config import ProfileConfig
from orchard_zeroclaw.profile.history import trim_history
from orchard_zeroclaw.profile.prompt import subagent_role, system_prompt
from orchard_zeroclaw.profile.schemas import main_tools, subagent_tools
from orchard_zeroclaw.profile.tools import ProfileTools, SandboxCallFailed, ToolAnswer, truncate_tool_result

LIMIT_NOTES = {
    "step_limit": "stopped: the step limit of {limit} model calls (ZeroClaw's max_tool_iterations) was reached",
    "time_limit": "stopped: out of time (the wall-time limit of {wall} s, or the evaluator's deadline for the task)",
    "budget_exhausted": "stopped: the gateway refused further calls, this rollout's budget is used up",
}


class RunEnded(Exception):
    """Ends the whole run, from the main agent or a delegated one: a limit or an error."""

    def __init__(self, exit_status: str, error: str | None = None) -> None:
        super().__init__(error or exit_status)
        self.exit_status, self.error = exit_status, error


@dataclass
class AgentEnd:
    exit_status: str  # submitted or step_limit (the rest end the run: RunEnded)
    reply: str


class Run:
    """One run of the profile on a task: the main agent and the agents it delegates to share the model
    client, the tools, the task's MCP tools and the clock."""

    def __init__(self, name: str, version: str, config: ProfileConfig, task: Task, sandbox: Sandbox,
                 model: ModelConfig) -> None:
        self.name, self.version, self.config, self.task, self.model = name, version, config, task, model
        self.workdir = task.environment.workdir
        self.tools = ProfileTools(sandbox, self.workdir, config)
        self.mcp = McpToolset(task, sandbox)
        self.started = time.monotonic()
        self.margin_s = deadline_margin_s(model.time_left_s() or 0.0)
        self.client: ChatClient | None = None
        self.delegated_runs: list[Trajectory] = []
        self.main: Trajectory | None = None  # the main agent's, once it runs

    # --- the run --------------------------------------------------------------------------------------

    async def run(self) -> Trajectory:
        self.client = ChatClient(self.model)  # before anything runs: a config without base_url is a usage error
        tools = main_tools(self.config.agents)
        main = StepsBuilder(self._agent(self.name, tools), task_id=self.task.id, rollout_key=self.model.rollout_key)
        self.main = main.trajectory
        status, error, limit = "", None, self.config.step_limit
        try:
            try:
                await self.mcp.__aenter__()
            except (McpCallFailed, OrchardError) as exc:
                raise RunEnded("environment_error", f"task {self.task.id}: its MCP tools could not be listed: "
                                                    f"{exc}") from None
            tools += self.mcp.definitions
            main.trajectory.agent.tool_definitions = tools
            end = await self.loop(main, system_prompt(self.workdir), self.task.instruction, tools, limit,
                                  can_delegate=bool(self.config.agents))
            status = end.exit_status
        except RunEnded as ended:
            status, error = ended.exit_status, ended.error
        finally:
            await self.client.aclose()
            await self.mcp.__aexit__(None, None, None)
        return self._finish(main, status, error, limit)

    async def loop(self, builder: StepsBuilder, system: str, task_message: str, tools: list[dict[str, Any]],
                   limit: int | None, *, can_delegate: bool = False) -> AgentEnd:
        """One agent's turn: until a reply without tool calls (`submitted`) or its step limit."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                          {"role": "user", "content": task_message}]
        builder.say("system", system)
        builder.say("user", task_message)
        calls = 0
        while True:
            if limit is not None and calls >= limit:
                return AgentEnd("step_limit", "")
            if (left := self.time_left()) is not None and left <= 0:
                raise RunEnded("time_limit")
            trim = trim_history(messages, self.config.max_history_messages)
            if trim is not None:
                messages = trim.messages
                builder.trimmed(trim)
            completion = await self._complete(messages, tools)
            calls += 1
            step = builder.agent_step(completion, self.model.model)
            messages.append(completion.assistant_message())
            if not completion.tool_calls:
                return AgentEnd("submitted", completion.content or "")
            for call in completion.tool_calls:
                answer, images, subagent = await self._call(call, can_delegate)
                builder.observe(step, call.id, answer.text, is_error=not answer.ok, images=images, subagent=subagent)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer.text})

    async def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        assert self.client is not None
        try:
            return await self.client.complete(messages, tools=tools, params=self.config.request_params)
        except BudgetExceeded:
            raise RunEnded("budget_exhausted") from None
        except OrchardError as exc:
            raise RunEnded("model_error", f"model call failed: {exc}") from None

    async def _call(self, call: CompletionToolCall,
                    can_delegate: bool) -> tuple[ToolAnswer, list[tuple[str, bytes]], str | None]:
        """One tool call: (the answer, an MCP tool's images, the id of a delegated run's trajectory)."""
        arguments, problem = call.parsed_arguments()
        if problem:
            return ToolAnswer(f"Error executing {call.name}: {problem}", ok=False), [], None
        if call.name == "delegate" and can_delegate:
            answer, subagent = await self.delegate(call.id, arguments)
            return answer, [], subagent
        if self.mcp.has(call.name):
            try:
                content, is_error, images = await self.mcp.call(call.name, arguments)
            except McpCallFailed as exc:
                return ToolAnswer(f"Error: {exc}", ok=False), [], None
            text = truncate_tool_result(content or "(no output)", self.config.max_tool_result_chars)
            return ToolAnswer(f"Error: {text}" if is_error else text, ok=not is_error), images, None
        if call.name in ProfileTools.NAMES:
            try:
                return await self.tools.call(call.name, arguments, time_left_s=self.time_left()), [], None
            except SandboxCallFailed as exc:
                raise RunEnded("sandbox_error", str(exc)) from None
        return ToolAnswer(f"Error: Unknown tool: {call.name}", ok=False), [], None

    # --- delegation -----------------------------------------------------------------------------------

    async def delegate(self, call_id: str, arguments: dict[str, Any]) -> tuple[ToolAnswer, str | None]:
        """`delegate(agent, prompt, context)`: the named sub-agent runs its own turn with the base tools (it
        cannot delegate: ZeroClaw's depth 1) and its reply is the result. An error of the model or the sandbox
        ends the whole run, as it would the main agent's."""
        agent, prompt = arguments.get("agent"), arguments.get("prompt")
        if not isinstance(agent, str) or agent not in self.config.agents:
            known = ", ".join(sorted(self.config.agents))
            return ToolAnswer(f"Error: Unknown agent '{agent}'. Available agents: {known}", ok=False), None
        if not isinstance(prompt, str) or not prompt.strip():
            return ToolAnswer("Error executing delegate: Missing 'prompt' parameter", ok=False), None
        context = arguments.get("context")
        message = f"{context}\n\n{prompt}" if isinstance(context, str) and context.strip() else prompt
        trajectory_id = f"delegate-{call_id}"
        tools = subagent_tools() + self.mcp.definitions
        builder = StepsBuilder(self._agent(f"{self.name}/{agent}", tools), task_id=self.task.id,
                               rollout_key=self.model.rollout_key, images_into=self.main)
        builder.trajectory.trajectory_id = builder.trajectory.session_id = trajectory_id
        builder.trajectory.extra["parent_tool_call_id"] = call_id
        limit = self.config.delegate_step_limit
        try:
            end = await self.loop(builder, system_prompt(self.workdir, role=subagent_role(
                agent, self.config.agents[agent])), message, tools, limit)
        except RunEnded as ended:
            self.delegated_runs.append(self._finish(builder, ended.exit_status, ended.error, limit))
            raise
        self.delegated_runs.append(self._finish(builder, end.exit_status, None, limit))
        if end.exit_status != "submitted":
            return ToolAnswer(f"Error: Agent '{agent}' reached its limit of {limit} tool iterations without an "
                              "answer", ok=False), trajectory_id
        header = f"[Agent '{agent}' (custom/{self.model.model}, agentic)]"
        return ToolAnswer(truncate_tool_result(f"{header}\n{end.reply}", self.config.max_tool_result_chars),
                          ok=True), trajectory_id

    # --- time and the end -----------------------------------------------------------------------------

    def time_left(self) -> float | None:
        """Seconds left under the own wall-time limit and the evaluator's deadline (less its margin), whichever
        comes first; None: no limit."""
        own = None if self.config.wall_time_limit_s is None else (
            self.config.wall_time_limit_s - (time.monotonic() - self.started))
        deadline = self.model.time_left_s()
        if deadline is not None:
            deadline -= self.margin_s
        left = [value for value in (own, deadline) if value is not None]
        return min(left) if left else None

    def _agent(self, name: str, tools: list[dict[str, Any]]) -> Agent:
        return Agent(name=name, version=self.version, model_name=self.model.model, tool_definitions=tools)

    def _finish(self, builder: StepsBuilder, status: str, error: str | None, limit: int | None) -> Trajectory:
        trajectory = builder.trajectory
        trajectory.exit_status = status
        if status in LIMIT_NOTES:
            trajectory.notes = LIMIT_NOTES[status].format(limit=limit, wall=self.config.wall_time_limit_s)
        if error is not None:
            trajectory.outcome = Outcome(error=error)
            trajectory.notes = error
        if builder.trajectory.trajectory_id is None:  # the main agent's: the delegated runs under it
            trajectory.subagent_trajectories = list(self.delegated_runs)
        return builder.finish(wall_time_s=time.monotonic() - self.started)
