"""The agent's final answer, for graders that read what the agent said (`ServicesGrader.final_text`, Claw-Eval's
`final_text`): the text of the last agent step that said anything — its message, and the text arguments of a
submit-like tool it called there (react's `submit(summary)`), in that order. Empty when the agent never said
anything (a no-op)."""

from __future__ import annotations

from orchard.core.trajectory import Content, Trajectory
from orchard.policies.tool_specs import SUBMIT_TOOL_NAMES

# An environment variable's value is capped by the kernel (MAX_ARG_STRLEN, 128 KiB): a longer answer is cut
# there, and the grader is told so by the mark at its end.
MAX_CHARS = 60_000
CUT_MARK = "\n[... the answer was cut here]"


def _text(content: Content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.text or "" for part in content if part.type == "text")


def final_text(trajectory: Trajectory | None) -> str:
    for step in reversed(trajectory.steps if trajectory else []):
        if step.source != "agent":
            continue
        parts = [_text(step.message).strip()]
        for call in step.tool_calls:
            # the harness's own submit only: a task's MCP tool (`todo__complete_task`) is an action, not an answer
            if call.function_name.lower() in SUBMIT_TOOL_NAMES:
                parts += [value.strip() for value in call.arguments.values() if isinstance(value, str)]
        text = "\n".join(part for part in parts if part)
        if text:
            return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + CUT_MARK
    return ""
