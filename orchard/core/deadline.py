"""`Deadline`: when a piece of work's time is up, as one instant on this process's monotonic clock.

It is made once, where a limit is set (`orchard eval --task-timeout`: the trial's `Deadline.after(...)`),
and handed down as it is: the trial gives the harness its agent's (`ModelConfig.deadline`), the harness
stops a margin before it (orchard/harnesses/deadline.py) and bounds each command by what is left. Every
level asks what is left (`time_left_s`); none converts it to wall-clock time and back, so a clock step
(NTP, a suspended laptop) never moves it."""

from __future__ import annotations

import time
from typing import Any

from pydantic_core import core_schema


class Deadline:
    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        """`at`: the instant, a `time.monotonic()` value (`Deadline.after(seconds)` makes one from now)."""
        self.at = at

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def time_left_s(self) -> float:
        """Seconds until the deadline, never below 0."""
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def sooner(self, seconds: float | None) -> Deadline:
        """This deadline, or `seconds` from now when that comes first (None: this one)."""
        return self if seconds is None else Deadline(min(self.at, time.monotonic() + seconds))

    def earlier_by(self, seconds: float) -> Deadline:
        """A deadline `seconds` before this one (a margin kept for what follows)."""
        return Deadline(self.at - seconds)

    def later_by(self, seconds: float) -> Deadline:
        """A deadline `seconds` after this one (time that did not count, e.g. waiting for a slot)."""
        return Deadline(self.at + seconds)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deadline) and other.at == self.at

    def __hash__(self) -> int:
        return hash(self.at)

    def __repr__(self) -> str:
        return f"Deadline(in {self.at - time.monotonic():.3f} s)"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        # A field of this type holds the object itself; dumped (reprs, logs) it is the seconds left, since
        # a monotonic instant means nothing outside this process.
        return core_schema.is_instance_schema(cls, serialization=core_schema.plain_serializer_function_ser_schema(
            lambda deadline: deadline.time_left_s(), when_used="always"))
