"""`shelly`, a plug-in harness that is not Orchard's: a small tool-calling loop with tools of its own
(`shell(cmd)`, `write_file(path, text)`, `done(note)`), its own prompts and its own way of showing a
command's result (`$? = N`, then the output). It declares its dialect (`ShellyHarness.dialect`, the protocol
of orchard/core/dialect.py), which is all it takes for it to join cross-harness distillation (its rollouts
translated into any other harness, any other's into it) and credit assignment (its rollouts replayed with its
own tools). tests/recipes/test_dialect_plugin.py registers it through an entry point, as an installed
plug-in is, and runs it."""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

import httpx

from orchard.core.actions import Action, Create, Shell, Submit, UntranslatableCall
from orchard.core.dialect import Observed, ReplayedCall, TaskText, first_user_message, observation_text
from orchard.core.errors import ModelError, OrchardError
from orchard.core.harness import ModelConfig
from orchard.core.sandbox import Sandbox
from orchard.core.task import Task
from orchard.core.trajectory import Agent, Observation, ObservationResult, Outcome, Step, ToolCall, Trajectory
from orchard.util.shell_forms import shell_command

NAME, VERSION = "shelly", "0.1.0"
SYSTEM = "You are shelly, a terse shell agent. You work in {workdir}. Call done when the task is solved."
TASK = "TASK {task_id}\n{instruction}"
NUDGE = "shelly: call shell, write_file or done."
STATUS = re.compile(r"\A\$\? = (-?\d+)\n")


def _tool(name: str, description: str, **parameters: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {key: {"type": "string", "description": text}
                                         for key, text in parameters.items()},
        "required": list(parameters)}}}


TOOLS = [_tool("shell", "Run a shell command in the working directory.", cmd="the command"),
         _tool("write_file", "Write a file (its directory is made).", path="the file", text="its content"),
         _tool("done", "Finish the task.", note="what was done")]


class ShellyTools:
    """shelly's tools in a sandbox: the harness runs its calls with them, and so does its replay."""

    def __init__(self, sandbox: Sandbox, workdir: str) -> None:
        self.sandbox, self.workdir = sandbox, workdir

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """What the call printed, and whether it ended the run."""
        if name == "shell":
            result = await self.sandbox.exec(["bash", "-c", arguments.get("cmd", "")], cwd=self.workdir, timeout=120)
            return f"$? = {result.exit_code}\n{result.stdout}{result.stderr}", False
        if name == "write_file":
            path = posixpath.join(self.workdir, arguments["path"])
            await self.sandbox.exec(["mkdir", "-p", posixpath.dirname(path)], timeout=30)
            await self.sandbox.write_file(path, arguments["text"].encode())
            return f"wrote {arguments['path']}", False
        if name == "done":
            return "bye", True
        return f"no tool {name!r}", False


class ShellyHarness:
    name, version = NAME, VERSION

    def __init__(self, max_steps: int = 20) -> None:
        self.max_steps = max_steps

    def dialect(self) -> ShellyDialect:
        return ShellyDialect()

    async def run(self, task: Task, sandbox: Sandbox, model: ModelConfig) -> Trajectory:
        workdir = task.environment.workdir
        messages = ShellyDialect().initial_messages(task.id, task.instruction, workdir)[0]
        trajectory = Trajectory(
            agent=Agent(name=NAME, version=VERSION, model_name=model.model, tool_definitions=TOOLS),
            task_id=task.id, rollout_key=model.rollout_key,
            steps=[Step(step_id=1, source="system", message=messages[0]["content"]),
                   Step(step_id=2, source="user", message=messages[1]["content"])])
        tools, trajectory.exit_status = ShellyTools(sandbox, workdir), "step_limit"
        headers = {**model.headers(), **({"Authorization": f"Bearer {model.api_key.get_secret_value()}"}
                                         if model.api_key else {})}
        async with httpx.AsyncClient(base_url=model.base_url or "", headers=headers, timeout=model.timeout_s) as http:
            try:
                for _ in range(self.max_steps):
                    if await self._turn(http, model, messages, tools, trajectory):
                        trajectory.exit_status = "submitted"
                        break
            except ModelError as exc:
                trajectory.outcome, trajectory.exit_status = Outcome(error=str(exc)), "model_error"
            except OrchardError as exc:
                trajectory.outcome, trajectory.exit_status = Outcome(error=str(exc)), "sandbox_error"
        return trajectory

    async def _turn(self, http: httpx.AsyncClient, model: ModelConfig, messages: list[dict[str, Any]],
                    tools: ShellyTools, trajectory: Trajectory) -> bool:
        body = {"model": model.model, "messages": messages, "tools": TOOLS, **model.sampling.request_kwargs()}
        try:
            response = await http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise ModelError(f"cannot reach the model: {exc}") from None
        if response.status_code >= 400:
            raise ModelError(f"the model answered {response.status_code}: {response.text[:300]}")
        answer = response.json()
        reply = answer["choices"][0]["message"]
        messages.append({"role": "assistant", "content": reply.get("content") or "",
                         **({"tool_calls": reply["tool_calls"]} if reply.get("tool_calls") else {})})
        calls, results, ended = [], [], False
        for call in reply.get("tool_calls") or []:
            raw = call["function"].get("arguments") or "{}"
            arguments = json.loads(raw)
            calls.append(ToolCall(tool_call_id=call["id"], function_name=call["function"]["name"],
                                  arguments=arguments, raw_arguments=raw))
            output, ended = await tools.call(call["function"]["name"], arguments)
            results.append(ObservationResult(source_call_id=call["id"], content=output))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            if ended:
                break
        if not calls:
            messages.append({"role": "user", "content": NUDGE})
        trajectory.steps.append(Step(
            step_id=trajectory.next_step_id, source="agent", model_name=model.model, message=reply.get("content") or "",
            tool_calls=calls, observation=Observation(results=results) if results else None,
            extra={"response_id": answer["id"]} if answer.get("id") else {}))
        if not calls:
            trajectory.steps.append(Step(step_id=trajectory.next_step_id, source="user", message=NUDGE))
        return ended


class ShellyDialect:
    """shelly's dialect: how it speaks, for translation and credit assignment."""

    name, version = NAME, VERSION
    ends_on_reply = False  # a reply without a tool call gets NUDGE
    captures_prompt = False  # its prompts are rendered here

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
        try:
            if name == "shell":
                return Shell(arguments["cmd"])
            if name == "write_file":
                return Create(arguments["path"], arguments["text"])
            if name == "done":
                return Submit(arguments.get("note"))
        except KeyError:
            raise UntranslatableCall(f"shelly call {name} has invalid arguments {arguments!r}") from None
        raise UntranslatableCall(f"shelly has no tool {name!r}")

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
        if isinstance(action, Shell):
            return "shell", {"cmd": action.command}
        if isinstance(action, Create) and not action.append:
            return "write_file", {"path": action.path, "text": action.content}
        if isinstance(action, Submit):
            return "done", {"note": action.summary or "done"}
        return "shell", {"cmd": shell_command(action)}  # views, replacements, edits: through its shell

    def initial_messages(self, task_id: str, instruction: str,
                         workdir: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [{"role": "system", "content": SYSTEM.format(workdir=workdir)},
                {"role": "user", "content": TASK.format(task_id=task_id, instruction=instruction)}], TOOLS

    def read_task(self, trajectory: Trajectory) -> TaskText:
        task = re.match(r"\ATASK [^\n]*\n(.*)\Z", first_user_message(trajectory), re.S)
        if task is None:
            raise UntranslatableCall("the shelly trajectory's task message is not shelly's")
        system = next((s.message for s in trajectory.steps if s.source == "system"), "")
        workdir = re.search(r"You work in (\S+)\. ", system if isinstance(system, str) else "")
        return TaskText(task.group(1), workdir.group(1) if workdir else None)

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = observation_text(result)
        status = STATUS.match(text)
        return Observed(text[status.end():], int(status.group(1))) if status else Observed(text)

    def result_text(self, function_name: str, observed: Observed) -> str:
        if function_name == "shell":
            return f"$? = {observed.returncode}\n{observed.output}"
        return "bye" if function_name == "done" else observed.output

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call_id, "content": self.result_text(name, observed)}
                for call_id, name, observed in calls]

    def no_tool_call_message(self) -> str:
        return NUDGE

    def replay(self, trajectory: Trajectory, workdir: str) -> ShellyReplay:
        return ShellyReplay(workdir)


class ShellyReplay:
    """A shelly rollout's calls run again with shelly's own tools."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    async def run(self, sandbox: Sandbox, call: ToolCall) -> ReplayedCall:
        return ReplayedCall(*await ShellyTools(sandbox, self.workdir).call(call.function_name, call.arguments))
