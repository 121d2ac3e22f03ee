"""A harness's dialect: how it speaks, for what works across harnesses (orchard/recipes: cross-harness
distillation, credit assignment). A harness declares its own with an optional method on its class,

    def dialect(self) -> Dialect: ...

returning an object that implements `Dialect` below for that harness (as configured): its tool calls read
into the neutral actions of orchard/core/actions.py and actions written back as its calls, its conversation
(first messages and tools, how a tool's result goes back to the model, what it says after a reply without a
tool call, and how to read the task and a tool's output back out of one of its trajectories), and how to
run its recorded calls again in a fresh sandbox. `harness_dialect(name)` finds a registered harness's
dialect, so a plug-in harness joins translation and credit assignment as the built-in ones do; a harness
without one is refused (`UntranslatableCall`). See docs/harness-adapters.md ("A harness's dialect")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn, Protocol, runtime_checkable

from orchard.core.actions import Action, UntranslatableCall
from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.harness import HARNESSES, get_harness
from orchard.core.sandbox import Sandbox
from orchard.core.trajectory import ObservationResult, ToolCall, Trajectory

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]]


@dataclass(frozen=True)
class Observed:
    """What a command or tool printed and its exit code, without any harness's framing: how a tool's result
    is carried from one harness to another."""

    output: str
    returncode: int = 0


@dataclass(frozen=True)
class TaskText:
    """The task as a trajectory's first messages say it; `workdir` where they name it."""

    instruction: str
    workdir: str | None = None


class ReplayedCall(NamedTuple):
    output: str  # what the call printed, as the harness shows it
    submitted: bool  # the call ended the run: the replay stops here


@runtime_checkable
class CallReplay(Protocol):
    """A trajectory's recorded calls run again, one at a time, in a sandbox of the same task."""

    async def run(self, sandbox: Sandbox, call: ToolCall) -> ReplayedCall: ...


@runtime_checkable
class Dialect(Protocol):
    """How one harness speaks (see the module docstring)."""

    name: str  # the harness's name, as its trajectories record it (`agent.name`)
    version: str  # its version, as its trajectories record it
    ends_on_reply: bool  # a reply without tool calls ends its run (no nudge follows it)
    captures_prompt: bool  # its first messages are rendered by the harness itself, so they are captured by
    # running it once per task (orchard/core/captured_prompts.py), not rendered by `initial_messages` alone

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
        """One of its recorded calls (with the text of its result) as a neutral action; UntranslatableCall
        for a call no action expresses."""

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]] | None:
        """`action` as one of its calls (tool name, arguments), None where it ends its run with a plain reply
        instead; `workdir` is the task's working directory."""

    def initial_messages(self, task_id: str, instruction: str, workdir: str) -> tuple[Messages, Tools]:
        """The messages its first model call sends for the task (system, task), and its tools."""

    def read_task(self, trajectory: Trajectory) -> TaskText:
        """The task, read back out of one of its trajectories' first messages."""

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        """A tool result it recorded, without its framing."""

    def result_text(self, function_name: str, observed: Observed) -> str:
        """A tool's output as it would record it (the observation's text)."""

    def result_messages(self, calls: list[tuple[str, str, Observed]]) -> Messages:
        """The messages that return the results of one step's calls (tool call id, tool name, output) to
        the model, as it sends them."""

    def no_tool_call_message(self) -> str | None:
        """What it tells the model after a reply without a tool call; None: such a reply ends its run."""

    def replay(self, trajectory: Trajectory, workdir: str) -> CallReplay:
        """How to run one of its trajectories' calls again with its own tools (or ones that do exactly what
        they did); UnreplayableCall, before any sandbox starts, for a call that cannot be."""


def harness_dialect(harness: str | Any, /) -> Dialect:
    """The dialect of a registered harness (by name, created with its default options) or of a harness
    object; UntranslatableCall for a harness that is not registered or declares none."""
    if isinstance(harness, str):
        try:
            target, _ = HARNESSES.load(harness)
            if isinstance(target, type) and not callable(getattr(target, "dialect", None)):
                _refuse(harness, "it declares no dialect (a `dialect()` method on its class, see "
                                 "docs/harness-adapters.md)")
            harness = get_harness(harness)
        except InvalidRequest as exc:
            _refuse(harness, str(exc))
    declare = getattr(harness, "dialect", None)
    if not callable(declare):
        _refuse(harness.name, "it declares no dialect (a `dialect()` method on its class, see "
                              "docs/harness-adapters.md)")
    dialect = declare()
    if not isinstance(dialect, Dialect):
        raise PluginError(f"harness {harness.name!r}: `dialect()` returned a {type(dialect).__name__}, which is not a "
                          "Dialect (orchard/core/dialect.py)")
    return dialect


def _refuse(name: str, why: str) -> NoReturn:
    raise UntranslatableCall(f"cannot translate to or from harness {name!r}: {why}; translation knows "
                             f"{', '.join(dialect_harnesses()) or 'no harness'}")


def dialect_harnesses() -> list[str]:
    """The registered harnesses whose class declares a dialect (each is imported; one that fails to import is
    left out)."""
    names = []
    for name in HARNESSES.names():
        try:
            target, _ = HARNESSES.load(name)
        except PluginError:
            continue
        if callable(getattr(target, "dialect", None)):
            names.append(name)
    return names


def first_user_message(trajectory: Trajectory) -> str:
    """The text of a trajectory's first user step: where harnesses put the task."""
    for step in trajectory.steps:
        if step.source == "user" and isinstance(step.message, str):
            return step.message
    raise UntranslatableCall(f"trajectory {trajectory.rollout_key!r} has no user step with the task")


def observation_text(result: ObservationResult | None) -> str:
    """A recorded tool result's text (its parts joined)."""
    if result is None or result.content is None:
        return ""
    if isinstance(result.content, str):
        return result.content
    return "".join(part.text or "" for part in result.content)
