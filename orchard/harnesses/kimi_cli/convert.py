"""Kimi-CLI's session logs → the Trajectory.

A print-mode run leaves one session under `$KIMI_SHARE_DIR/sessions/<md5 of workdir>/<session id>/`:

- `context.jsonl`: the conversation exactly as Kimi sends it to the model, one message a line (first line
  `{"role": "_system_prompt"}`; `_checkpoint` and `_usage` lines are bookkeeping). A compaction rotates it
  to `context_1.jsonl` (`_2`, ...) and starts it again with the system prompt, the summary (a user message)
  and the last messages it preserved: those are copies of earlier steps, `is_copied_context` here.
- `wire.jsonl`: Kimi's event stream (TurnBegin, StepBegin, ContentPart, ToolCall, StatusUpdate, ToolResult,
  CompactionBegin/End, SubagentEvent, TurnEnd). Each step's `StatusUpdate.message_id` is the id of the
  chat completion that produced it, which is how an agent step finds its gateway record
  (`extra["response_id"]`). A wire log cut short (a killed run) is read as far as it goes.
- `subagents/<agent id>/{context.jsonl,wire.jsonl,meta.json}`: each `Agent` tool call's subagent, converted
  the same way into `subagent_trajectories`, linked from the parent's tool result
  (`subagent_trajectory_ref`), matched by the wire's `SubagentEvent.parent_tool_call_id`.

Every step comes from a logged message: an agent step is an assistant message Kimi received from the model
(its text, its think parts as reasoning, its tool calls with the raw argument text), observations are the
tool messages Kimi sent back, linked by call id. Nothing is made up where a log is missing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import (
    Agent, Observation, ObservationResult, Step, SubagentTrajectoryRef, ToolCall, Trajectory,
)
from orchard.harnesses.in_sandbox.native_log import parse_jsonl

SESSIONS = "sessions"
COMPACTION_PREFIX = "Previous context has been compacted."
_ROTATED = re.compile(r"^context_(\d+)\.jsonl$")
LOG_NAMES = ("context.jsonl", "wire.jsonl", "state.json", "meta.json", "prompt.txt")


@dataclass
class KimiLog:
    """One agent's logs (the main session or a subagent): its context files oldest first, its wire events."""

    directory: str
    contexts: list[list[dict[str, Any]]] = field(default_factory=list)
    wire: list[dict[str, Any]] = field(default_factory=list)
    agent_id: str | None = None
    subagent_type: str | None = None

    def response_ids(self) -> list[str]:
        """The completion ids of this agent's own steps, in order (a subagent's, relayed in the parent's wire
        as SubagentEvent, are not)."""
        return [event["payload"]["message_id"] for event in self.events()
                if event.get("type") == "StatusUpdate" and event.get("payload", {}).get("message_id")]

    def events(self) -> list[dict[str, Any]]:
        return [record["message"] for record in self.wire if isinstance(record.get("message"), dict)]

    def subagent_calls(self) -> dict[str, str]:
        """agent id → the id of the parent's `Agent` tool call that ran it."""
        calls: dict[str, str] = {}
        for event in self.events():
            payload = event.get("payload") or {}
            if event.get("type") == "SubagentEvent" and payload.get("agent_id") and payload.get("parent_tool_call_id"):
                calls.setdefault(payload["agent_id"], payload["parent_tool_call_id"])
        return calls

    def ended_turn(self) -> bool:
        return any(event.get("type") == "TurnEnd" for event in self.events())

    def compactions(self) -> int:
        return sum(1 for event in self.events() if event.get("type") == "CompactionEnd")


@dataclass
class KimiSession:
    """What one Kimi run left in its share dir, read out of the sandbox."""

    main: KimiLog | None = None
    subagents: list[KimiLog] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    log_text: str = ""

    @classmethod
    async def read(cls, sandbox: Sandbox, share_dir: str) -> KimiSession:
        listing = await sandbox.exec(["find", f"{share_dir}/{SESSIONS}", "-type", "f"], timeout=60)
        paths = sorted(path for path in listing.stdout.splitlines() if path.strip())
        session = cls(paths=[path for path in paths if path.rsplit("/", 1)[-1] in LOG_NAMES
                             or _ROTATED.match(path.rsplit("/", 1)[-1])])
        logs: dict[str, KimiLog] = {}
        for path in session.paths:
            directory, name = path.rsplit("/", 1)
            log = logs.setdefault(directory, KimiLog(directory=directory))
            if name == "wire.jsonl":
                log.wire = parse_jsonl(await sandbox.read_file(path))
            elif name == "meta.json":
                meta = json.loads(await sandbox.read_file(path) or b"{}")
                log.agent_id, log.subagent_type = meta.get("agent_id"), meta.get("subagent_type")
        for directory, log in logs.items():
            names = [path.rsplit("/", 1)[1] for path in session.paths if path.rsplit("/", 1)[0] == directory]
            rotated = sorted((int(m.group(1)), n) for n in names if (m := _ROTATED.match(n)))
            order = [n for _, n in rotated] + (["context.jsonl"] if "context.jsonl" in names else [])
            log.contexts = [parse_jsonl(await sandbox.read_file(f"{directory}/{n}")) for n in order]
            if "/subagents/" in directory:
                log.agent_id = log.agent_id or directory.rsplit("/", 1)[1]
                session.subagents.append(log)
            elif log.contexts or log.wire:
                session.main = log
        kimi_log = f"{share_dir}/logs/kimi.log"
        found = await sandbox.exec(["tail", "-c", "20000", kimi_log], timeout=30)
        if found.exit_code == 0:
            session.log_text = found.stdout
            session.paths.append(kimi_log)
        return session

    def native_logs(self) -> list[str]:
        """What the evaluator keeps: the session's directory whole (its subagents' logs included) and
        Kimi's own log."""
        kept = [self.main.directory] if self.main else []
        return kept + [path for path in self.paths if path.endswith("/logs/kimi.log")]

    @property
    def model_called(self) -> bool:
        return any(log.response_ids() or _assistant_messages(log) for log in self._logs())

    @property
    def model_failed(self) -> str | None:
        """The provider error Kimi logged, when its model calls failed."""
        for line in self.log_text.splitlines():
            if "LLM provider error" in line or "ChatProviderError" in line or "APIStatusError" in line:
                return line.split(" - ", 1)[-1].strip()[:500]
        return None

    @property
    def max_steps_reached(self) -> bool:
        return "Max steps reached" in self.log_text

    def _logs(self) -> list[KimiLog]:
        return ([self.main] if self.main else []) + self.subagents


def _assistant_messages(log: KimiLog) -> list[dict[str, Any]]:
    return [m for context in log.contexts for m in context if m.get("role") == "assistant"]


def trajectory_from_session(session: KimiSession, agent: Agent) -> Trajectory:
    """The main agent's Trajectory, its subagents' under `subagent_trajectories`."""
    if session.main is None:
        return Trajectory(agent=agent, extra={"kimi_session": None})
    subagents = {log.agent_id: log for log in session.subagents if log.agent_id}
    parent_calls = session.main.subagent_calls()
    trajectory = trajectory_from_log(session.main, agent)
    for agent_id, log in sorted(subagents.items()):
        sub_agent = agent.model_copy(update={"name": f"{agent.name}/{log.subagent_type or 'subagent'}"})
        sub = trajectory_from_log(log, sub_agent)
        sub.session_id = sub.trajectory_id = agent_id
        sub.extra["parent_tool_call_id"] = parent_calls.get(agent_id)
        trajectory.subagent_trajectories.append(sub)
        _link_subagent(trajectory, parent_calls.get(agent_id), agent_id)
    return trajectory


def trajectory_from_log(log: KimiLog, agent: Agent) -> Trajectory:
    steps: list[Step] = []
    response_ids = iter(log.response_ids())
    previous: list[dict[str, Any]] = []
    system_prompt = None
    for index, context in enumerate(log.contexts):
        messages = [m for m in context if not str(m.get("role", "")).startswith("_")]
        system_prompt = next((m.get("content") for m in context if m.get("role") == "_system_prompt"), system_prompt)
        if index == 0 and system_prompt is not None:
            steps.append(_step(len(steps) + 1, "system", _text(system_prompt)))
        start = 1 if messages and _is_summary(messages[0]) else 0
        copied = range(start, start + _copied_prefix(messages[start:], previous)) if index > 0 else range(0)
        for position, message in enumerate(messages):
            _add_message(steps, message, response_ids, position in copied)
        previous = messages
    logged = sum(1 for step in steps if step.source == "agent" and not step.is_copied_context)
    for pending in wire_steps(log)[logged:]:  # replies the wire has but the context not yet (a killed run)
        steps.append(_wire_step(len(steps) + 1, pending))
    trajectory = Trajectory(agent=agent, steps=steps,
                            exit_status="submitted" if log.ended_turn() else None)
    trajectory.extra["kimi_compactions"] = log.compactions()
    return trajectory


@dataclass
class WireStep:
    """One step as the wire logged it: the model's reply (its parts and tool calls, as streamed) and the
    results of its tool calls."""

    response_id: str | None = None
    text: str = ""
    think: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)


def wire_steps(log: KimiLog) -> list[WireStep]:
    """The agent's own steps in its wire log whose model call completed (a `StatusUpdate` with the reply's id
    was logged): Kimi appends a reply to context.jsonl only once its tool calls have run, so a run killed
    mid-command has its last reply here alone. A reply still streaming when the log ends is left out."""
    steps: list[WireStep] = []
    for event in log.events():
        kind, payload = event.get("type"), event.get("payload") or {}
        if kind == "StepBegin":
            steps.append(WireStep())
        elif not steps:
            continue
        elif kind == "ContentPart" and payload.get("type") == "text":
            steps[-1].text += payload.get("text") or ""
        elif kind == "ContentPart" and payload.get("type") == "think":
            steps[-1].think += payload.get("think") or ""
        elif kind == "ToolCall":
            steps[-1].calls.append({"id": payload.get("id"), "function": dict(payload.get("function") or {})})
        elif kind == "ToolCallPart" and steps[-1].calls:  # streamed argument text
            function = steps[-1].calls[-1]["function"]
            function["arguments"] = (function.get("arguments") or "") + (payload.get("arguments_part") or "")
        elif kind == "StatusUpdate" and payload.get("message_id"):
            steps[-1].response_id = payload["message_id"]
        elif kind == "ToolResult":
            steps[-1].results.append(payload)
    return [step for step in steps if step.response_id is not None]


def _wire_step(step_id: int, pending: WireStep) -> Step:
    step = _step(step_id, "agent", pending.text, reasoning_content=pending.think or None,
                 tool_calls=[_tool_call(call) for call in pending.calls])
    step.extra.update({"response_id": pending.response_id, "kimi_from_wire": True})
    results = [ObservationResult(source_call_id=r.get("tool_call_id"),
                                 content=str((r.get("return_value") or {}).get("output") or ""))
               for r in pending.results]
    if results:
        step.observation = Observation(results=results)
    return step


def _copied_prefix(after: list[dict[str, Any]], previous: list[dict[str, Any]]) -> int:
    """How many of the messages after a compaction's summary repeat the end of the context before it."""
    for n in range(min(len(after), len(previous)), 0, -1):
        if after[:n] == previous[-n:]:
            return n
    return 0


def _is_summary(message: dict[str, Any]) -> bool:
    return message.get("role") == "user" and COMPACTION_PREFIX in _text(message.get("content"))


def _add_message(steps: list[Step], message: dict[str, Any], response_ids, copied: bool) -> None:
    role = message.get("role")
    if role == "assistant":
        step = _step(len(steps) + 1, "agent", _text(message.get("content"), kinds=("text",)),
                     reasoning_content=_text(message.get("content"), kinds=("think",)) or None,
                     tool_calls=[_tool_call(call) for call in message.get("tool_calls") or []])
        step.is_copied_context = copied
        if not copied:
            response_id = next(response_ids, None)
            if response_id is not None:
                step.extra["response_id"] = response_id
        steps.append(step)
    elif role == "tool":
        result = ObservationResult(source_call_id=message.get("tool_call_id"), content=_text(message.get("content")))
        owner = next((s for s in reversed(steps) if any(c.tool_call_id == result.source_call_id
                                                         for c in s.tool_calls)), None)
        if owner is not None and owner.is_copied_context == copied:
            owner.observation = owner.observation or Observation()
            owner.observation.results.append(result)
        else:  # a tool result whose call is not in this context (kept by a compaction): a step of its own
            step = _step(len(steps) + 1, "system", "", observation=Observation(results=[result]))
            step.is_copied_context = copied
            steps.append(step)
    else:
        step = _step(len(steps) + 1, "user" if role == "user" else "system", _text(message.get("content")))
        step.is_copied_context = copied
        if _is_summary(message):
            step.extra["kimi_compaction_summary"] = True
        steps.append(step)


def _link_subagent(trajectory: Trajectory, call_id: str | None, agent_id: str) -> None:
    if call_id is None:
        return
    for step in trajectory.steps:
        for result in (step.observation.results if step.observation else []):
            if result.source_call_id == call_id and not any(ref.session_id == agent_id
                                                            for ref in result.subagent_trajectory_ref):
                result.subagent_trajectory_ref.append(SubagentTrajectoryRef(session_id=agent_id))


def _step(step_id: int, source: str, message: str, **fields: Any) -> Step:
    return Step(step_id=step_id, source=source, message=message, **fields)


def _tool_call(call: dict[str, Any]) -> ToolCall:
    function = call.get("function") or {}
    raw = function.get("arguments")
    try:
        parsed = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        parsed = {}
    return ToolCall(tool_call_id=call.get("id") or "?", function_name=function.get("name") or "?",
                    arguments=parsed if isinstance(parsed, dict) else {}, raw_arguments=raw)


def _text(content: Any, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's text: a string as is, content parts of the given kinds joined (think parts carry `think`)."""
    if isinstance(content, str):
        return content if "text" in kinds else ""
    if isinstance(content, list):
        return "".join(str(part.get("think" if part.get("type") == "think" else "text", ""))
                       for part in content if isinstance(part, dict) and part.get("type") in kinds)
    return ""
