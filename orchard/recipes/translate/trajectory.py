"""Cross-harness distillation: a trajectory recorded in harness A, rendered as harness B would have recorded
it — B's system and instance prompts, B's tools, B's way of returning tool results — so a teacher's rollouts
in one harness train a student for another. What each harness says and how is its dialect, which the harness
declares itself (orchard/core/dialect.py; react's is orchard/harnesses/react/dialect.py): A's reads each of
its calls into a neutral action (orchard/core/actions.py), B's writes the action as its own call. Any
registered harness with a dialect can be A or B, a plug-in's too.

`translate_trajectory(trajectory, "mini-swe-agent")` returns a Trajectory whose `agent.name` is B, whose
agent steps make B's tool calls with the teacher's own words (message and reasoning kept), and whose
`llm_calls` hold, for each agent step, the request B would have sent (messages + B's tools) and the reply
in B's vocabulary: what `orchard.recipes.common.examples.build_examples` trains on. The calls carry no
token ids (the text was translated, so no policy produced those tokens: examples are rendered with the
student's template). The outcome, task and exit status are the source's: the translated calls do the same
work, which `replay.replay_patch` checks by running them with B's tools in a fresh sandbox.

A harness that renders its own prompts (`Dialect.captures_prompt`: Kimi-CLI, OpenHands) has them captured
from the harness itself first (captured.py), and its replay check runs the real harness
(harness_replay.py).

Tool results are translated as text (an exit code and output carried over); `observations=` replaces them
with what B's tools really printed (from `replay_patch`). The translated rollout's key is the source's
with `@B` appended, so both can be in one dataset."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from orchard.core.actions import Action, Submit, UntranslatableCall
from orchard.core.dialect import Dialect, Observed, harness_dialect
from orchard.core.trajectory import (Agent, FinalMetrics, LLMCall, Observation, ObservationResult, Step, ToolCall,
                                     Trajectory)

DEFAULT_WORKDIR = "/testbed"


def translate_trajectory(trajectory: Trajectory, target: str, *, instruction: str | None = None,
                         workdir: str | None = None, observations: Mapping[str, str] | None = None,
                         target_dialect: Dialect | None = None) -> Trajectory:
    """`trajectory` as harness `target` would have recorded it. `instruction` / `workdir` default to what
    the source's first user message (its instance template) says. Raises UntranslatableCall when a call has
    no equivalent in the target's tools.

    How runs end differs (e.g. react calls a submit tool, mini-swe-agent runs its submit command, Kimi-CLI
    ends with a reply that calls no tool). A source's ending becomes the target's (`Submit`); a reply without
    tool calls in the middle of a run whose harness answers it with a nudge is left out of a target where it
    would end the run (`Dialect.ends_on_reply`)."""
    source_name = trajectory.agent.name
    source = harness_dialect(source_name)
    target_d = target_dialect or harness_dialect(target)
    task = source.read_task(trajectory) if instruction is None or workdir is None else None
    instruction = instruction if instruction is not None else task.instruction
    workdir = workdir or (task.workdir if task else None) or DEFAULT_WORKDIR
    messages, tools = target_d.initial_messages(trajectory.task_id or "", instruction, workdir)
    builder = _Builder(trajectory, target_d, messages, tools)
    agent_steps = [s for s in trajectory.steps if s.source == "agent" and not s.is_copied_context]
    for step in agent_steps:
        results = {r.source_call_id: r for r in (step.observation.results if step.observation else [])}
        translated: list[tuple[ToolCall, Action, Observed]] = []
        ends, summary = False, None
        actions = [(call, source.read_call(call.function_name, call.arguments,
                                           _content(results.get(call.tool_call_id)))) for call in _valid(step)]
        if not actions and source.ends_on_reply:  # the source's run ends with this reply
            actions = [(None, Submit(step.message if isinstance(step.message, str) and step.message else None))]
        if not actions and target_d.ends_on_reply:
            continue  # a nudged reply in the source would end the target's run: left out
        for call, action in actions:
            written = target_d.write_call(action, workdir)
            if written is None:  # the target ends its run with a plain reply
                ends, summary = True, getattr(action, "summary", None)
                continue
            name, arguments = written
            as_target = target_d.read_call(name, arguments, "")  # what the call is in the target
            call_id = call.tool_call_id if call is not None else f"call_end_{step.step_id}"
            observed = source.read_result(call.function_name, results.get(call.tool_call_id)) if call else Observed("")
            translated.append((ToolCall(tool_call_id=call_id, function_name=name, arguments=arguments,
                                        raw_arguments=json.dumps(arguments)), as_target, observed))
            if isinstance(as_target, Submit):
                ends = True
                break
        closing = summary if ends and not translated and not step.message else None
        builder.agent_step(step, translated, observations or {}, content=closing)
        if ends and translated and not any(isinstance(a, Submit) for _, a, _ in translated):
            builder.final_reply(step, summary)  # calls ran first; then the reply that ends the run
        if ends:
            break
    return builder.finish(target, source_name)


def _valid(step: Step) -> list[ToolCall]:
    for call in step.tool_calls:
        if not call.arguments_valid:
            raise UntranslatableCall(f"step {step.step_id}: call {call.tool_call_id} has malformed arguments")
    return list(step.tool_calls)


def translate_all(trajectories: Iterable[Trajectory], target: str) -> tuple[list[Trajectory], dict[str, str]]:
    """Every trajectory not already in `target` translated (those in `target` kept as they are); the
    rollouts that could not be translated, by rollout key, with why."""
    target_d = harness_dialect(target)
    kept, refused = [], {}
    for trajectory in trajectories:
        if trajectory.agent.name == target:
            kept.append(trajectory)
            continue
        try:
            kept.append(translate_trajectory(trajectory, target, target_dialect=target_d))
        except UntranslatableCall as exc:
            refused[trajectory.rollout_key or trajectory.session_id or "?"] = str(exc)
    return kept, refused


class _Builder:
    """The target trajectory and the conversation the target harness would have sent, step by step."""

    def __init__(self, source: Trajectory, target: Dialect, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]]) -> None:
        self.source, self.target, self.tools = source, target, tools
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.steps = [Step(step_id=i, source="system" if m["role"] == "system" else "user",
                           message=_message_text(m.get("content"))) for i, m in enumerate(messages, start=1)]
        self.calls: list[LLMCall] = []
        self.source_calls = {call.id: call for call in source.llm_calls}

    def agent_step(self, step: Step, translated: list[tuple[ToolCall, Action, Observed]],
                   observations: Mapping[str, str], content: str | None = None) -> None:
        content = content or (step.message if isinstance(step.message, str) else "")
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if step.reasoning_content:
            assistant["reasoning_content"] = step.reasoning_content
        if translated:
            assistant["tool_calls"] = [{"id": call.tool_call_id, "type": "function", "function": {
                "name": call.function_name, "arguments": call.raw_arguments}} for call, _, _ in translated]
        call = self._llm_call(step, assistant)
        new_step = Step(step_id=len(self.steps) + 1, source="agent", model_name=step.model_name, message=content,
                        reasoning_content=step.reasoning_content, tool_calls=[c for c, _, _ in translated],
                        llm_call_count=1, llm_call_ids=[call.id], timestamp=step.timestamp,
                        extra={"translated_from_step": step.step_id})
        self.steps.append(new_step)
        self.messages.append(assistant)
        if not translated:
            nudge = self.target.no_tool_call_message()
            if nudge is None:  # the reply ends the target's run
                return
            self.messages.append({"role": "user", "content": nudge})
            self.steps.append(Step(step_id=len(self.steps) + 1, source="user", message=nudge))
            return
        answered = [(c.tool_call_id, c.function_name, observed) for c, action, observed in translated
                    if not isinstance(action, Submit)]
        results = []
        for c, action, observed in translated:
            text = observations.get(c.tool_call_id)
            if text is None:
                text = self.target.result_text(c.function_name, observed) if not isinstance(action, Submit) else ""
            results.append(ObservationResult(source_call_id=c.tool_call_id, content=text))
        new_step.observation = Observation(results=results)
        messages = self.target.result_messages(answered)
        for message in messages:
            replayed = observations.get(message.get("tool_call_id", ""))
            if replayed is not None:
                message["content"] = replayed
        self.messages.extend(messages)

    def final_reply(self, step: Step, text: str | None) -> None:
        """The reply without tool calls that ends the target's run, after `step`'s calls ran."""
        assistant = {"role": "assistant", "content": text or ""}
        call = self._llm_call(step, assistant, suffix="end")
        self.steps.append(Step(step_id=len(self.steps) + 1, source="agent", model_name=step.model_name,
                               message=assistant["content"], llm_call_count=1, llm_call_ids=[call.id],
                               timestamp=step.timestamp, extra={"translated_from_step": step.step_id}))
        self.messages.append(assistant)

    def _llm_call(self, step: Step, assistant: dict[str, Any], suffix: str = "") -> LLMCall:
        original = next((self.source_calls[i] for i in step.llm_call_ids if i in self.source_calls), None)
        finish = "tool_calls" if assistant.get("tool_calls") else "stop"
        call = LLMCall(id=f"{original.id if original else f'step-{step.step_id}'}{suffix}@{self.target.name}",
                       rollout_key=_key(self.source, self.target.name),
                       model=original.model if original else self.source.agent.model_name,
                       request_messages=[dict(m) for m in self.messages],
                       request_params={"tools": self.tools},
                       response={"object": "chat.completion", "choices": [
                           {"index": 0, "message": assistant, "finish_reason": finish}]},
                       extra={"translated_from_call": original.id if original else None})
        self.calls.append(call)
        return call

    def finish(self, target: str, source_name: str) -> Trajectory:
        source = self.source
        agent = Agent(name=target, version=self.target.version, model_name=source.agent.model_name,
                      tool_definitions=self.tools,
                      extra={"translated_from": {"harness": source_name, "version": source.agent.version}})
        return Trajectory(agent=agent, steps=self.steps, task_id=source.task_id, rollout_key=_key(source, target),
                          outcome=source.outcome, llm_calls=self.calls, exit_status=source.exit_status,
                          partial=source.partial, notes=source.notes,
                          final_metrics=FinalMetrics(total_steps=len(self.steps), n_llm_calls=len(self.calls)))


def _key(trajectory: Trajectory, target: str) -> str | None:
    return f"{trajectory.rollout_key}@{target}" if trajectory.rollout_key else None


def _message_text(content: Any) -> str:
    if isinstance(content, list):  # content parts (Kimi-CLI and OpenHands send lists)
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _content(result: ObservationResult | None) -> str:
    if result is None or result.content is None:
        return ""
    return result.content if isinstance(result.content, str) else "".join(p.text or "" for p in result.content)


__all__ = ["translate_trajectory", "translate_all", "UntranslatableCall"]
