"""One agent's trajectory as the profile's loop goes (the main agent's, or a delegated run's): the system and
task steps, one agent step per model call (its text, reasoning, tool calls, metrics, the response id the
evaluator links to the gateway's record), the results linked by call id, and at a history cut the breadcrumb
followed by the kept context repeated as copied steps."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from orchard.core.trajectory import (IMAGE_TYPES, IMAGES_DIR, PENDING_IMAGES, Agent, ContentPart, FinalMetrics,
                                     ImageSource, Observation, ObservationResult, Step, SubagentTrajectoryRef, ToolCall,
                                     Trajectory)
from orchard.harnesses.openai_client import Completion

from orchard_zeroclaw.profile.history import Trim


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat()


class StepsBuilder:
    """`images_into`: the trajectory whose extra holds the images to write (a delegated run's go to the main
    trajectory's, which is the one the evaluator writes out)."""

    def __init__(self, agent: Agent, *, task_id: str | None, rollout_key: str | None,
                 images_into: Trajectory | None = None) -> None:
        self.trajectory = Trajectory(agent=agent, task_id=task_id, rollout_key=rollout_key)
        self.images_into = images_into or self.trajectory
        self.completions: list[Completion] = []

    def say(self, source: str, text: str, *, copied: bool = False, extra: dict[str, Any] | None = None) -> Step:
        return self._append(Step(step_id=self.trajectory.next_step_id, timestamp=utc_now(), source=source,
                                 message=text, is_copied_context=copied, extra=extra or {}))

    def agent_step(self, completion: Completion, model_name: str) -> Step:
        self.completions.append(completion)
        extra: dict[str, Any] = {"finish_reason": completion.finish_reason}
        if completion.response_id:
            extra["response_id"] = completion.response_id
        return self._append(Step(
            step_id=self.trajectory.next_step_id, timestamp=utc_now(), source="agent", model_name=model_name,
            message=completion.content or "", reasoning_content=completion.reasoning_content,
            tool_calls=[call.to_trajectory() for call in completion.tool_calls], metrics=completion.metrics(),
            llm_call_count=1, extra=extra))

    def observe(self, step: Step, call_id: str, text: str, *, is_error: bool, images: list[tuple[str, bytes]] = (),
                subagent: str | None = None) -> None:
        """A tool's result; an MCP tool's images as image parts after the text (their bytes in
        extra[PENDING_IMAGES] until the evaluator writes them beside the trajectory); a delegated run's
        trajectory referenced by its id."""
        if step.observation is None:
            step.observation = Observation()
        content: str | list[ContentPart] = text
        if images:
            pending = self.images_into.extra.setdefault(PENDING_IMAGES, {})
            content = [ContentPart(type="text", text=text)]
            run = quote(self.trajectory.rollout_key or self.trajectory.task_id or "run", safe="")
            for media_type, data in images:
                path = f"{IMAGES_DIR}/{run}/{step.step_id}-{len(pending) + 1}.{IMAGE_TYPES[media_type]}"
                pending[path] = base64.b64encode(data).decode("ascii")
                content.append(ContentPart(type="image", source=ImageSource(media_type=media_type, path=path)))
        step.observation.results.append(ObservationResult(
            source_call_id=call_id, content=content, extra={"is_error": True} if is_error else {},
            subagent_trajectory_ref=[SubagentTrajectoryRef(session_id=subagent, trajectory_id=subagent)]
            if subagent else []))

    def trimmed(self, trim: Trim) -> None:
        """A history cut: the context the model sees from now on, in its order: the anchor (copied), the
        breadcrumb (new, with the cut as ZeroClaw reports it), the kept messages (copied)."""
        anchor, *kept = trim.kept
        self._copy([anchor])
        self.say("user", trim.messages[2]["content"], extra={"zeroclaw_history_trimmed": trim.frame()})
        self._copy(kept)

    def _copy(self, messages: list[dict[str, Any]]) -> None:
        current: Step | None = None
        for message in messages:
            role, text = message.get("role"), message.get("content")
            text = text if isinstance(text, str) else ""
            if role == "assistant":
                calls = [ToolCall.from_openai(call) for call in message.get("tool_calls") or []]
                current = self._append(Step(step_id=self.trajectory.next_step_id, source="agent", message=text,
                                            tool_calls=calls, is_copied_context=True))
            elif role == "tool" and current is not None:
                if current.observation is None:
                    current.observation = Observation()
                current.observation.results.append(ObservationResult(source_call_id=message.get("tool_call_id"),
                                                                     content=text))
            elif role in ("user", "system"):
                self.say(role, text, copied=True)
                current = None

    def finish(self, *, wall_time_s: float) -> Trajectory:
        def total(key: str) -> int | None:
            values = [c.usage.get(key) for c in self.completions if isinstance(c.usage.get(key), int)]
            return sum(values) if values else None

        self.trajectory.final_metrics = FinalMetrics(
            total_prompt_tokens=total("prompt_tokens"), total_completion_tokens=total("completion_tokens"),
            total_steps=len(self.trajectory.steps), wall_time_s=wall_time_s, n_llm_calls=len(self.completions))
        return Trajectory.model_validate(self.trajectory.model_dump())  # built without re-validation: once, here

    def _append(self, step: Step) -> Step:
        self.trajectory.steps.append(step)
        return step
