"""Per-rollout budgets: how many model calls, tokens and seconds a rollout may use at the gateway.

A call is admitted (and counted) before it is sent, so concurrent calls cannot overshoot `max_calls`.
Tokens are only known once a call returns: the call that crosses `max_total_tokens` completes, the next one
is refused. Wall time runs from the rollout's first call. A refusal is a `BudgetExceeded` (HTTP 429)."""

from __future__ import annotations

import threading
import time

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.errors import BudgetExceeded


class Budget(BaseModel):
    """Limits for one rollout; None means no limit."""

    model_config = ConfigDict(extra="forbid")

    max_calls: int | None = Field(default=None, gt=0, description="model calls, failed ones included")
    max_total_tokens: int | None = Field(default=None, gt=0, description="prompt + completion tokens, summed")
    max_wall_time_s: float | None = Field(default=None, gt=0, description="seconds since the first call")


class RolloutUsage(BaseModel):
    calls: int = Field(default=0, description="calls admitted so far")
    total_tokens: int = Field(default=0, description="prompt + completion tokens of the calls that returned")
    elapsed_s: float | None = Field(default=None, description="seconds since the first call; None before it")


class _Account:
    __slots__ = ("budget", "calls", "total_tokens", "first_call_at")

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.calls = 0
        self.total_tokens = 0
        self.first_call_at: float | None = None


class BudgetLedger:
    """Budgets and usage of every live rollout (thread-safe). A rollout that was never started explicitly
    gets the default budget at its first call."""

    def __init__(self, default: Budget | None = None) -> None:
        self.default = default or Budget()
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}

    def set_budget(self, key: str, budget: Budget | None = None) -> None:
        """Start a rollout, or give a running one a new budget (its usage so far is kept)."""
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                self._accounts[key] = _Account(budget or self.default)
            else:
                account.budget = budget or self.default

    def admit(self, key: str) -> None:
        """Count one more call for `key`, or raise `BudgetExceeded` naming the budget that ran out."""
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                account = self._accounts[key] = _Account(self.default)
            now = time.monotonic()
            refusal = _refusal(key, account, now)
            if refusal:
                raise BudgetExceeded(refusal)
            account.calls += 1
            if account.first_call_at is None:
                account.first_call_at = now

    def charge(self, key: str, tokens: int) -> None:
        with self._lock:
            account = self._accounts.get(key)
            if account is not None:  # ended while the call was in flight: nothing left to charge
                account.total_tokens += tokens

    def budget(self, key: str) -> Budget:
        with self._lock:
            account = self._accounts.get(key)
            return account.budget if account else self.default

    def usage(self, key: str) -> RolloutUsage | None:
        with self._lock:
            account = self._accounts.get(key)
            if account is None:
                return None
            elapsed = None if account.first_call_at is None else time.monotonic() - account.first_call_at
            return RolloutUsage(calls=account.calls, total_tokens=account.total_tokens, elapsed_s=elapsed)

    def forget(self, key: str) -> bool:
        with self._lock:
            return self._accounts.pop(key, None) is not None

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._accounts


def _refusal(key: str, account: _Account, now: float) -> str | None:
    budget = account.budget
    what_to_do = (f"end the rollout (DELETE /v1/rollouts/{key}) or give it a larger budget "
                  f"(POST /v1/rollouts/{key})")
    if budget.max_calls is not None and account.calls >= budget.max_calls:
        return (f"rollout {key!r} used its budget of {budget.max_calls} model calls (max_calls); no further call "
                f"is sent to the model: {what_to_do}")
    if budget.max_total_tokens is not None and account.total_tokens >= budget.max_total_tokens:
        return (f"rollout {key!r} used {account.total_tokens} tokens, its budget is {budget.max_total_tokens} "
                f"(max_total_tokens); no further call is sent to the model: {what_to_do}")
    if budget.max_wall_time_s is not None and account.first_call_at is not None:
        elapsed = now - account.first_call_at
        if elapsed >= budget.max_wall_time_s:
            return (f"rollout {key!r} has run {elapsed:.1f} s since its first model call, its budget is "
                    f"{budget.max_wall_time_s:g} s (max_wall_time_s); no further call is sent to the model: "
                    f"{what_to_do}")
    return None
