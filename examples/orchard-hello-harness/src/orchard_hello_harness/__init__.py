"""The `hello` harness: the smallest real tool-calling agent loop Orchard can evaluate.

Each turn sends the conversation to the model (through `model.base_url`, the Orchard gateway, with
`model.headers()`, which carry the rollout key), runs each `bash` call in the sandbox's workdir and sends the
output back, and stops at `submit` or after `max_steps` model calls. It returns the trajectory ungraded:
grading is the evaluator's job. A failed model call or sandbox ends the run with `Outcome(error=...)`, which
the evaluator records as an error rather than a failed attempt. It stops a margin before the evaluator's
deadline (`model.deadline`, through `run_limit_s`) and returns what it has, with exit status `time_limit`,
rather than being cut off there with nothing. Each agent step keeps the response's id in
`extra["response_id"]`, which the evaluator links to the gateway's record of that call (tokens, logprobs)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from orchard.core.errors import ModelError, OrchardError
from orchard.core.harness import ModelConfig
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Observation, ObservationResult, Outcome, Step, ToolCall, Trajectory
from orchard.harnesses.deadline import run_limit_s

TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the repository; returns exit code and output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Finish: call it when the change is complete.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]
SYSTEM_PROMPT = ("You fix bugs in the repository at {workdir} using the bash tool. When the fix is done, "
                 "call submit.")
MAX_OUTPUT_CHARS = 8000


class HelloHarness:
    name = "hello"
    version = "0.1.0"

    def __init__(self, max_steps: int = 20, command_timeout_s: float = 60) -> None:
        self.max_steps = max_steps
        self.command_timeout_s = command_timeout_s

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        workdir = task.environment.workdir
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=workdir)},
            {"role": "user", "content": task.instruction}]
        trajectory = Trajectory(
            agent=Agent(name=self.name, version=self.version, model_name=model.model, tool_definitions=TOOLS),
            task_id=task.id, rollout_key=model.rollout_key,
            steps=[Step(step_id=1, source="system", message=messages[0]["content"]),
                   Step(step_id=2, source="user", message=task.instruction)])
        headers = dict(model.headers())
        if model.api_key is not None:
            headers["Authorization"] = f"Bearer {model.api_key.get_secret_value()}"
        trajectory.exit_status = "step_limit"
        limit = run_limit_s(model)  # the deadline less a margin; None: no deadline
        stop_at = None if limit is None else time.monotonic() + limit
        async with httpx.AsyncClient(base_url=model.base_url or "", headers=headers, timeout=model.timeout_s) as http:
            try:
                for _ in range(self.max_steps):
                    try:
                        if _left(stop_at) == 0:
                            raise TimeoutError
                        async with asyncio.timeout(_left(stop_at)):  # a model call may not outlast our stop
                            reply = await self._complete(http, model, messages)
                    except TimeoutError:  # our own stop, before the deadline: the steps so far are kept
                        trajectory.exit_status = "time_limit"
                        trajectory.notes = "stopped itself before the evaluator's deadline"
                        break
                    messages.append(reply)
                    if await self._act(reply, sandbox, workdir, messages, trajectory, stop_at):
                        trajectory.exit_status = "submitted"
                        break
            except ModelError as exc:  # the model failed: an error, not a failed attempt
                trajectory.outcome, trajectory.exit_status = Outcome(error=f"{exc.code}: {exc}"), "model_error"
            except OrchardError as exc:  # the sandbox failed: likewise
                trajectory.outcome, trajectory.exit_status = Outcome(error=f"{exc.code}: {exc}"), "sandbox_error"
        return trajectory

    async def _complete(self, http: httpx.AsyncClient, model: ModelConfig,
                        messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": model.model, "messages": messages, "tools": TOOLS, **model.sampling.request_kwargs()}
        try:
            response = await http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise ModelError(f"cannot reach the model at {model.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise ModelError(f"the model answered {response.status_code}: {response.text[:300]}")
        answer = response.json()
        message = answer["choices"][0]["message"]
        if not message.get("tool_calls"):
            message["content"] = message.get("content") or ""  # an assistant turn must say something
        message["_response_id"] = answer.get("id")
        return message

    async def _act(self, reply: dict[str, Any], sandbox: Sandbox, workdir: str, messages: list[dict[str, Any]],
                   trajectory: Trajectory, stop_at: float | None) -> bool:
        """Run the reply's tool calls and record the step; True when the agent submitted."""
        response_id = reply.pop("_response_id", None)
        calls, results, submitted = [], [], False
        for call in reply.get("tool_calls") or []:
            name, call_id, raw = call["function"]["name"], call["id"], call["function"].get("arguments") or "{}"
            arguments = _json_object(raw)
            # raw_arguments: the text the model wrote, which training replays as written (even when malformed)
            calls.append(ToolCall(tool_call_id=call_id, function_name=name, arguments=arguments or {},
                                  raw_arguments=raw))
            if arguments is None:
                output = f"the arguments of {name} are not a JSON object: {raw[:200]}"
            elif name == "submit":
                output, submitted = "submitted", True
            elif name == "bash" and _left(stop_at) == 0:
                output = "not run: out of time"
            elif name == "bash":
                timeout = min(self.command_timeout_s, _left(stop_at) or self.command_timeout_s)
                result = await sandbox.exec(arguments.get("command", ""), cwd=workdir, timeout=timeout)
                output = f"exit code {result.exit_code}\n{result.output[-MAX_OUTPUT_CHARS:]}"
            else:
                output = f"unknown tool {name!r}; use bash or submit"
            results.append(ObservationResult(source_call_id=call_id, content=output))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        if not calls:
            messages.append({"role": "user", "content": "Use the bash tool, or call submit when you are done."})
        trajectory.steps.append(Step(
            step_id=trajectory.next_step_id, source="agent", model_name=trajectory.agent.model_name,
            message=reply.get("content") or "", tool_calls=calls,
            observation=Observation(results=results) if results else None,
            extra={"response_id": response_id} if response_id else {}))
        return submitted


def _left(stop_at: float | None) -> float | None:
    """Seconds until our own stop (0 once passed), None without a deadline."""
    return None if stop_at is None else max(0.0, stop_at - time.monotonic())


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
