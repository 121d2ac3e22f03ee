"""Injected faults, as Claw-Eval's ERROR_RATE injects them: some calls of an action answer 429 or 500
(nothing is done; the client should retry) or answer late ("slow", then normally). Given to a service as
the JSON of `CLAW_FAULTS`:

    {"schedule": ["429", "500"],   the first matching calls meet these, in order (then `rate` applies)
     "rate": 0.3,                  each later matching call meets a fault with this probability ...
     "kinds": ["429", "500", "slow"],   ... drawn from these
     "seed": 7,                    the draws' random seed: the same calls meet the same faults on every run
     "slow_s": 2.0,                how late a "slow" answer is
     "actions": ["send_message"],  the actions that meet faults (default: all of them)
     "max": 3}                     at most this many faults in all (default: no limit)

A kind is "slow" or an HTTP status (a number as text, 400-599). Standard library only."""

from __future__ import annotations

import json
import threading

KINDS_DEFAULT = ("429", "500", "slow")
FIELDS = ("schedule", "rate", "kinds", "seed", "slow_s", "actions", "max")


class FaultSpecError(ValueError):
    pass


def check_kind(kind) -> str:
    if kind == "slow" or (isinstance(kind, str) and kind.isdigit() and 400 <= int(kind) <= 599):
        return kind
    raise FaultSpecError(f"a fault is \"slow\" or an HTTP status from 400 to 599 as text, not {json.dumps(kind)}")


class FaultPlan:
    def __init__(self, spec: dict) -> None:
        if not isinstance(spec, dict):
            raise FaultSpecError("CLAW_FAULTS must be a JSON object")
        unknown = sorted(set(spec) - set(FIELDS))
        if unknown:
            raise FaultSpecError(f"CLAW_FAULTS has unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
        self.schedule = [check_kind(kind) for kind in spec.get("schedule", [])]
        self.rate = float(spec.get("rate", 0.0))
        if not 0.0 <= self.rate <= 1.0:
            raise FaultSpecError(f"CLAW_FAULTS rate must be in [0, 1], not {self.rate}")
        self.kinds = [check_kind(kind) for kind in spec.get("kinds", KINDS_DEFAULT)]
        if self.rate and not self.kinds:
            raise FaultSpecError("CLAW_FAULTS has a rate but no kinds to draw from")
        self.seed = spec.get("seed", 0)
        self.slow_s = float(spec.get("slow_s", 2.0))
        self.actions = set(spec["actions"]) if spec.get("actions") is not None else None
        self.max = spec.get("max")
        self.reset()

    @classmethod
    def from_json(cls, text: str | None) -> FaultPlan:
        if not text:
            return cls({})
        try:
            spec = json.loads(text)
        except ValueError as exc:
            raise FaultSpecError(f"CLAW_FAULTS is not JSON: {exc}") from None
        return cls(spec)

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.random = None
        if self.rate:
            import random  # only when drawn: it is most of this module's import time

            self.random = random.Random(self.seed)
        self.pending = list(self.schedule)
        self.injected = 0

    def draw(self, action: str) -> str | None:
        """The fault this call of `action` meets, or None."""
        if self.actions is not None and action not in self.actions:
            return None
        with self.lock:
            if self.max is not None and self.injected >= self.max:
                return None
            kind = None
            if self.pending:
                kind = self.pending.pop(0)
            elif self.rate and self.random.random() < self.rate:
                kind = self.random.choice(self.kinds)
            if kind is not None:
                self.injected += 1
            return kind
