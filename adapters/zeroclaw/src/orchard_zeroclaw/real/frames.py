"""What a real ZeroClaw run left (the driver's frames.jsonl, calls.jsonl and result.json), as the Trajectory.

The frames give the steps, in ZeroClaw's own order:

- `chunk`, `thinking`: the text and the reasoning of the current agent step (a new one after tool results);
- `tool_call {id, name, args}`: a tool call of the current agent step; `tool_result {id, name, output}`: the
  result of the call with that id;
- `approval_request`: `extra["zeroclaw_approvals"]`, the request, the step it came in and the answer sent;
- `history_trimmed`: the context ZeroClaw sends after the cut, as steps: what it kept, repeated with
  `is_copied_context`, and what is new (its breadcrumb) as a user step with the frame in its `extra`;
- `done`: the final reply (an agent step when it was not streamed as chunks), the frame in
  `extra["zeroclaw_done"]`; `session_start`, `plan`, `error`, `aborted`: `extra` (`zeroclaw_session`,
  `zeroclaw_plans`, `zeroclaw_end`);
- any other type, or a frame that is not JSON: kept as it came in `extra["zeroclaw_unknown_frames"]`, never
  dropped.

The relay's records (calls.jsonl) join the steps to the model calls: each agent step is matched to the call
whose answer made its tool calls (by the calls' ids, which ZeroClaw keeps), or, for a reply, to the next
call; the step then carries the response's id (`extra["response_id"]`, which the evaluator links to the
gateway's record with its token ids), the arguments as the model wrote them, and the call's text where no
chunk carried it. The first call's request gives the system and task steps and the tools offered. A
`delegate` (or `spawn_subagent`) call's sub-agent sends no frames: the calls of the conversation it started
while that tool ran are its steps, as `subagent_trajectories` referenced from the tool's result. Calls of any
other conversation (a memory consolidation) are listed in `extra["zeroclaw_other_calls"]`. Everything is
ordered by when each call started and by the frames' own order, never by when a frame was read, so a slow
reader cannot shuffle it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import (Agent, Metrics, Observation, ObservationResult, Step, SubagentTrajectoryRef,
                                     ToolCall, Trajectory, json_object)
from orchard.harnesses.in_sandbox.native_log import read_json, read_jsonl

KNOWN = frozenset({"session_start", "connected", "chunk", "thinking", "tool_call", "tool_result", "approval_request",
                   "history_trimmed", "plan", "done", "error", "aborted"})
SUBAGENT_TOOLS = frozenset({"delegate", "spawn_subagent"})


@dataclass
class ZeroClawLog:
    """The driver's files, as far as they exist (a killed driver leaves them cut short)."""

    state_dir: str
    frames: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None

    @classmethod
    async def read(cls, sandbox: Sandbox, state_dir: str) -> ZeroClawLog:
        return cls(state_dir, frames=await read_jsonl(sandbox, f"{state_dir}/frames.jsonl"),
                   calls=await read_jsonl(sandbox, f"{state_dir}/calls.jsonl"),
                   result=await read_json(sandbox, f"{state_dir}/result.json"))

    def native_logs(self) -> list[str]:
        return [f"{self.state_dir}/{name}" for name in ("frames.jsonl", "calls.jsonl", "result.json", "gateway.log")]

    @property
    def model_called(self) -> bool:
        return bool(self.calls)

    def last_call(self) -> dict[str, Any] | None:
        return max(self.calls, key=lambda call: call.get("done", 0)) if self.calls else None


def trajectory_from_log(log: ZeroClawLog, agent: Agent, instruction: str) -> Trajectory:
    return _Reader(log, agent, instruction).trajectory()


class _Reader:
    def __init__(self, log: ZeroClawLog, agent: Agent, instruction: str) -> None:
        self.log, self.agent, self.instruction = log, agent, instruction
        self.calls = sorted(log.calls, key=lambda call: call.get("seq", 0))  # in the order they started
        self.answered = [c for c in self.calls if not c.get("error") and isinstance(c.get("message"), dict)]
        self.main = self.calls[0]["conversation"] if self.calls else None
        self.steps: list[Step] = []
        self.extra: dict[str, Any] = {}
        # the main conversation's requests that do not extend the one before (the first aside): one follows each cut
        restarts = [c for c in self.calls if c["conversation"] == self.main and not c.get("extends")][1:]
        self.restarts = iter(sorted(restarts, key=lambda call: call.get("seq", 0)))
        self.delegated: set[int] = set()  # the seq of every call a sub-agent made

    # --- the steps ------------------------------------------------------------------------------------

    def trajectory(self) -> Trajectory:
        tools = self._prologue()
        current: Step | None = None
        fresh = True  # the next chunk, thinking or tool call starts a new agent step (a new model call)
        owner: dict[str, Step] = {}
        delegations: list[tuple[str, str, str]] = []  # (call id, tool, prompt) of the sub-agent tools, in order
        approvals: dict[str, dict[str, Any]] = {}
        done = None
        for entry in self.log.frames:
            frame = entry.get("frame")
            if entry.get("dir") == "out":
                if isinstance(frame, dict) and frame.get("type") == "approval_response":
                    request = approvals.get(str(frame.get("request_id")))
                    if request is not None:
                        request["decision"] = frame.get("decision")
                continue
            kind = frame.get("type") if isinstance(frame, dict) else None
            if kind not in KNOWN:
                kept = {"seq": entry.get("seq"), **({"frame": frame} if isinstance(frame, dict) else
                                                     {"raw": entry.get("raw", frame)})}
                self.extra.setdefault("zeroclaw_unknown_frames", []).append(kept)
                continue
            if kind in ("chunk", "thinking", "tool_call"):
                if current is None or fresh:
                    current = self._step(Step(step_id=1, source="agent", model_name=self.agent.model_name))
                    fresh = False
                if kind == "chunk":
                    current.message = (current.message or "") + _text(frame.get("content"))
                elif kind == "thinking":
                    current.reasoning_content = (current.reasoning_content or "") + _text(frame.get("content"))
                else:
                    call_id = _text(frame.get("id")) or f"call-{entry.get('seq')}"
                    args = frame.get("args")
                    current.tool_calls.append(ToolCall(
                        tool_call_id=call_id, function_name=_text(frame.get("name")) or "unknown",
                        arguments=args if isinstance(args, dict) else {},
                        extra={} if isinstance(args, dict) else {"zeroclaw_args": args}))
                    owner[call_id] = current
                    if current.tool_calls[-1].function_name in SUBAGENT_TOOLS:
                        prompt = args.get("prompt") if isinstance(args, dict) else None
                        delegations.append((call_id, current.tool_calls[-1].function_name, _text(prompt)))
            elif kind == "tool_result":
                call_id = _text(frame.get("id"))
                step = owner.get(call_id)
                if step is None:
                    self.extra.setdefault("zeroclaw_unpaired_results", []).append(frame)
                    continue
                if step.observation is None:
                    step.observation = Observation()
                output = frame.get("output")
                step.observation.results.append(ObservationResult(
                    source_call_id=call_id, content=output if isinstance(output, str) else json.dumps(output),
                    extra={"is_error": True} if isinstance(output, str) and output.startswith("Error") else {}))
                fresh = True
            elif kind == "approval_request":
                request = {"frame": frame, "step_id": current.step_id if current is not None else None,
                           "decision": None}
                approvals[str(frame.get("request_id"))] = request
                self.extra.setdefault("zeroclaw_approvals", []).append(request)
            elif kind == "history_trimmed":
                self._trimmed(frame)
                current, fresh = None, True
            elif kind == "plan":
                self.extra.setdefault("zeroclaw_plans", []).append(frame)
            elif kind == "session_start":
                self.extra["zeroclaw_session"] = frame
            elif kind == "done":
                done = self.extra["zeroclaw_done"] = frame
            elif kind in ("error", "aborted"):
                self.extra["zeroclaw_end"] = frame
        if done is not None:
            final = _text(done.get("full_response"))
            if current is not None and not current.tool_calls and not fresh:
                current.message = current.message or final
            elif final:
                self._step(Step(step_id=1, source="agent", model_name=self.agent.model_name, message=final))
        self._link()
        delegated = self._delegated_runs(delegations, owner)
        self._others()
        agent = self.agent.model_copy(update={"tool_definitions": tools})
        trajectory = Trajectory(agent=agent, steps=self.steps, subagent_trajectories=delegated, extra=self.extra,
                                exit_status="submitted" if done is not None else None)
        session = self.extra.get("zeroclaw_session") or {}
        if session.get("session_id"):
            trajectory.session_id = str(session["session_id"])
        return trajectory

    def _step(self, step: Step) -> Step:
        step.step_id = len(self.steps) + 1
        self.steps.append(step)
        return step

    def _prologue(self) -> list[dict[str, Any]]:
        """The system and task steps from the main conversation's first request (the tools it offered), or the
        task as the driver sent it when ZeroClaw never called the model."""
        first = next((c for c in self.calls if c["conversation"] == self.main and not c.get("extends")), None)
        if first is None:
            sent = next((e["frame"] for e in self.log.frames if e.get("dir") == "out"
                         and isinstance(e.get("frame"), dict) and e["frame"].get("type") == "message"), None)
            self._step(Step(step_id=1, source="user", message=_text((sent or {}).get("content")) or self.instruction))
            return []
        for message in first.get("messages") or []:
            if message.get("role") in ("system", "user"):
                self._step(Step(step_id=1, source=message["role"], message=_content(message.get("content"))))
            elif message.get("role") == "assistant":
                break
        return [tool for tool in first.get("tools") or [] if isinstance(tool, dict)]

    def _trimmed(self, frame: dict[str, Any]) -> None:
        """The main request after the cut (the next one that does not extend the request before it): what it
        repeats of the conversation so far, copied; the rest new."""
        after = next(self.restarts, None)
        self.extra.setdefault("zeroclaw_history_trimmed", []).append(frame)
        if after is None:  # the run ended before the next call: only the cut is known
            self._step(Step(step_id=1, source="user", message="", extra={"zeroclaw_history_trimmed": frame}))
            return
        seen = self._seen_before(after)
        marked = False
        pending: Step | None = None
        for message in after.get("messages") or []:
            role = message.get("role")
            if role == "system":
                continue
            copied = _norm(message) in seen
            if role == "assistant":
                calls = [ToolCall.from_openai(call) for call in message.get("tool_calls") or []]
                pending = self._step(Step(step_id=1, source="agent", message=_content(message.get("content")),
                                          tool_calls=calls, is_copied_context=copied))
            elif role == "tool" and pending is not None:
                pending.observation = pending.observation or Observation()
                pending.observation.results.append(ObservationResult(source_call_id=message.get("tool_call_id"),
                                                                     content=_content(message.get("content"))))
            else:
                extra = {} if copied or marked else {"zeroclaw_history_trimmed": frame}
                marked = marked or not copied
                self._step(Step(step_id=1, source="user", message=_content(message.get("content")),
                                is_copied_context=copied, extra=extra))
                pending = None

    def _seen_before(self, call: dict[str, Any]) -> set[tuple]:
        """Every message of the main conversation before `call`: those its earlier requests sent and the
        answers they got."""
        seen: set[tuple] = set()
        for earlier in self.calls:
            if earlier["conversation"] != self.main or earlier.get("seq", 0) >= call.get("seq", 0):
                continue
            seen.update(_norm(message) for message in earlier.get("messages") or [])
            if isinstance(earlier.get("message"), dict):
                seen.add(_norm({"role": "assistant", **earlier["message"]}))
        return seen

    # --- the model calls ------------------------------------------------------------------------------

    def _link(self) -> None:
        """Each agent step (not copied) to the main conversation's call that produced it, in order."""
        main = [c for c in self.answered if c["conversation"] == self.main]
        position = 0
        for step in self.steps:
            if step.source != "agent" or step.is_copied_context or position >= len(main):
                continue
            if step.tool_calls:
                first_id = step.tool_calls[0].tool_call_id
                found = next((index for index in range(position, len(main))
                              if first_id in _call_ids(main[index])), None)
                if found is None:
                    continue
            else:
                found = position
            _annotate(step, main[found])
            position = found + 1

    def _delegated_runs(self, delegations: list[tuple[str, str, str]], owner: dict[str, Step]) -> list[Trajectory]:
        """The conversations a sub-agent tool started: those whose first call came after the main call that
        asked for it and before the main conversation's next call (ZeroClaw waits for the tool), by start
        order, which no timing of the frames can shuffle. Several sub-agent calls in one answer share that
        span: each takes the conversation whose task holds its prompt, or else the next one in order."""
        main = sorted((c for c in self.calls if c["conversation"] == self.main), key=lambda c: c.get("seq", 0))
        firsts: dict[str, dict[str, Any]] = {}
        for call in sorted(self.calls, key=lambda c: c.get("seq", 0)):
            if call["conversation"] != self.main:
                firsts.setdefault(call["conversation"], call)
        taken: set[str] = set()
        trajectories = []
        for call_id, tool, prompt in delegations:
            asking = next((c for c in main if call_id in _call_ids(c)), None)
            if asking is None:
                continue
            following = next((c for c in main if c.get("seq", 0) > asking.get("seq", 0)), None)
            span = [key for key, first in firsts.items() if key not in taken
                    and asking.get("seq", 0) < first.get("seq", 0) < (following or {}).get("seq", float("inf"))]
            chosen = next((key for key in span if prompt and prompt in json.dumps(firsts[key].get("messages"))),
                          span[0] if span else None)
            if chosen is None:
                continue
            taken.add(chosen)
            calls = sorted((c for c in self.calls if c["conversation"] == chosen), key=lambda c: c.get("seq", 0))
            self.delegated.update(c.get("seq", 0) for c in calls)
            sub = _from_calls([c for c in calls if not c.get("error") and isinstance(c.get("message"), dict)] or calls,
                              self.agent.model_copy(update={"name": f"{self.agent.name}/{tool}"}))
            sub.trajectory_id = sub.session_id = call_id
            sub.extra["parent_tool_call_id"] = call_id
            trajectories.append(sub)
            step = owner[call_id]
            for result in step.observation.results if step.observation else []:
                if result.source_call_id == call_id:
                    result.subagent_trajectory_ref = [SubagentTrajectoryRef(session_id=call_id, trajectory_id=call_id)]
        return trajectories

    def _others(self) -> None:
        others = [{key: call.get(key) for key in ("seq", "conversation", "response_id", "status", "error")}
                  for call in self.calls if call["conversation"] != self.main and call.get("seq") not in self.delegated]
        failed = [{key: call.get(key) for key in ("seq", "status", "error")} for call in self.calls
                  if call["conversation"] == self.main and call.get("error")]
        if others:
            self.extra["zeroclaw_other_calls"] = others
        if failed:
            self.extra["zeroclaw_failed_calls"] = failed


def _from_calls(calls: list[dict[str, Any]], agent: Agent) -> Trajectory:
    """A conversation known only from the relay's records (a sub-agent's): its first request's system and
    task messages, each answer an agent step, each call's results the next request's tool messages."""
    steps: list[Step] = []

    def add(step: Step) -> Step:
        step.step_id = len(steps) + 1
        steps.append(step)
        return step

    for message in calls[0].get("messages") or []:
        if message.get("role") in ("system", "user"):
            add(Step(step_id=1, source=message["role"], message=_content(message.get("content"))))
        elif message.get("role") == "assistant":
            break
    for index, call in enumerate(calls):
        step = add(Step(step_id=1, source="agent", model_name=agent.model_name,
                        tool_calls=[ToolCall(tool_call_id=c.get("id") or f"call-{index}-{n}",
                                             function_name=c.get("name") or "unknown", arguments={})
                                    for n, c in enumerate((call.get("message") or {}).get("tool_calls") or [])]))
        _annotate(step, call)
        following = calls[index + 1] if index + 1 < len(calls) else None
        ids = {c.tool_call_id for c in step.tool_calls}
        for message in (following or {}).get("messages") or []:
            if message.get("role") == "tool" and message.get("tool_call_id") in ids:
                step.observation = step.observation or Observation()
                step.observation.results.append(ObservationResult(source_call_id=message["tool_call_id"],
                                                                  content=_content(message.get("content"))))
    last = (calls[-1].get("message") or {}) if calls else {}
    return Trajectory(agent=agent.model_copy(update={"tool_definitions": calls[0].get("tools") or []}), steps=steps,
                      exit_status="submitted" if not last.get("tool_calls") else None)


def _annotate(step: Step, call: dict[str, Any]) -> None:
    """The call's response id, usage and words on the step: the arguments as the model wrote them, its text
    where the frames carried none."""
    message = call.get("message") or {}
    if call.get("response_id"):
        step.extra["response_id"] = call["response_id"]
    usage = call.get("usage") or {}
    if usage:
        step.metrics = Metrics(prompt_tokens=usage.get("prompt_tokens"),
                               completion_tokens=usage.get("completion_tokens"))
    if not step.message and message.get("content"):
        step.message = message["content"]
    if not step.reasoning_content and message.get("reasoning_content"):
        step.reasoning_content = message["reasoning_content"]
    raw = {c.get("id"): c for c in message.get("tool_calls") or []}
    for index, tool_call in enumerate(step.tool_calls):
        written = raw.get(tool_call.tool_call_id)
        if written is None or not isinstance(written.get("arguments"), str):
            continue
        parsed = json_object(written["arguments"])
        if parsed is not None and parsed != tool_call.arguments and tool_call.arguments:
            tool_call.extra["zeroclaw_args"] = tool_call.arguments
        step.tool_calls[index] = tool_call.model_copy(update={
            "arguments": parsed if parsed is not None else tool_call.arguments, "raw_arguments": written["arguments"]})


def _call_ids(call: dict[str, Any]) -> set[str]:
    return {c.get("id") for c in (call.get("message") or {}).get("tool_calls") or []}


def _norm(message: dict[str, Any]) -> tuple:
    """A message as far as a repeat of it is recognised: an answer by its text and its calls' ids, a tool
    result by its call's id (ZeroClaw may cut a long one), any other by its role and text."""
    role = message.get("role")
    if role == "assistant":
        return role, _content(message.get("content")), tuple(sorted(str(c.get("id")) for c in
                                                                    message.get("tool_calls") or []))
    if role == "tool":
        return role, str(message.get("tool_call_id"))
    return role, _content(message.get("content"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text", "") for part in value if isinstance(part, dict))
    return ""
