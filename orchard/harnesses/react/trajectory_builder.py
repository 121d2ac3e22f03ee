"""Builds the ReAct harness's Trajectory as the run goes: a system step, the user step with the task, then
one agent step per model call (its text, reasoning, tool calls and their linked observations)."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from urllib.parse import quote

from orchard.core.trajectory import (IMAGE_TYPES, IMAGES_DIR, PENDING_IMAGES, Agent, ContentPart, FinalMetrics,
                                     ImageSource, Observation, ObservationResult, Step, Trajectory)
from orchard.harnesses.openai_client import Completion


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat()


class TrajectoryBuilder:
    def __init__(self, agent: Agent, *, task_id: str, rollout_key: str | None) -> None:
        self.trajectory = Trajectory(agent=agent, task_id=task_id, rollout_key=rollout_key)
        self._completions: list[Completion] = []

    def add_message(self, source: str, message: str) -> Step:
        return self._append(Step(step_id=self.trajectory.next_step_id, timestamp=utc_now(), source=source,
                                 message=message))

    def add_completion(self, completion: Completion, model_name: str) -> Step:
        """An agent step for one model call. The response id is kept in `extra["response_id"]`: it is the
        `response["id"]` of the LLMCall the gateway recorded, so an evaluator can link step and call."""
        self._completions.append(completion)
        extra = {"finish_reason": completion.finish_reason}
        if completion.response_id:
            extra["response_id"] = completion.response_id
        return self._append(Step(
            step_id=self.trajectory.next_step_id, timestamp=utc_now(), source="agent", model_name=model_name,
            message=completion.content or "", reasoning_content=completion.reasoning_content,
            tool_calls=[call.to_trajectory() for call in completion.tool_calls], metrics=completion.metrics(),
            llm_call_count=1, extra=extra))

    def observe(self, step: Step, call_id: str, content: str, *, is_error: bool,
                images: list[tuple[str, bytes]] = ()) -> None:
        """A tool's result; its images (an MCP tool's: media type, bytes) as image parts after the text, the
        bytes kept in extra[PENDING_IMAGES] until the evaluator writes them beside the trajectory."""
        if step.observation is None:
            step.observation = Observation()
        parts: str | list[ContentPart] = content
        if images:
            pending = self.trajectory.extra.setdefault(PENDING_IMAGES, {})
            parts = [ContentPart(type="text", text=content)]
            run = quote(self.trajectory.rollout_key or self.trajectory.task_id or "run", safe="")
            for media_type, data in images:
                path = f"{IMAGES_DIR}/{run}/{step.step_id}-{len(pending) + 1}.{IMAGE_TYPES[media_type]}"
                pending[path] = base64.b64encode(data).decode("ascii")
                parts.append(ContentPart(type="image", source=ImageSource(media_type=media_type, path=path)))
        step.observation.results.append(ObservationResult(
            source_call_id=call_id, content=parts, extra={"is_error": True} if is_error else {}))

    def finish(self, *, wall_time_s: float) -> Trajectory:
        def total(key: str) -> int | None:
            values = [c.usage.get(key) for c in self._completions if isinstance(c.usage.get(key), int)]
            return sum(values) if values else None

        cached = [m.cached_tokens for m in (c.metrics() for c in self._completions) if m.cached_tokens is not None]
        costs = [m.cost_usd for m in (c.metrics() for c in self._completions) if m.cost_usd is not None]
        self.trajectory.final_metrics = FinalMetrics(
            total_prompt_tokens=total("prompt_tokens"), total_completion_tokens=total("completion_tokens"),
            total_cached_tokens=sum(cached) if cached else None, total_cost_usd=sum(costs) if costs else None,
            total_steps=len(self.trajectory.steps), wall_time_s=wall_time_s, n_llm_calls=len(self._completions))
        # Built step by step without re-validation: validate the whole document once, here.
        return Trajectory.model_validate(self.trajectory.model_dump())

    def _append(self, step: Step) -> Step:
        self.trajectory.steps.append(step)
        return step
