"""The estimators a report prints, as pure functions of counts:

- **pass@k**: the chance that at least one of k attempts at a task succeeds, estimated without bias from n
  attempts with c successes as 1 − C(n−c, k) / C(n, k) (Chen et al. 2021): the share of the k-subsets of the
  n attempts that hold a success. Drawing k from n, not raising c/n to a power, is what makes it unbiased.
- **pass^k**: the chance that all k attempts succeed (tau-bench's consistency measure), estimated without
  bias as C(c, k) / C(n, k): the share of the k-subsets that are all successes.
  Both need n ≥ k: with fewer attempts the estimate does not exist, and they return None rather than make
  one up (a task short of attempts says so). pass@1 = pass^1 = c/n.
- **the Wilson score interval** of a rate: unlike the normal ("Wald") interval or a bootstrap, it does not
  shrink to a point at 0 % or 100 %: 6 successes of 6 give 61 %–100 % at 95 %, not 100 %–100 %."""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import BaseModel, Field

CONFIDENCE = 0.95


class Interval(BaseModel):
    low: float
    high: float
    confidence: float = CONFIDENCE


class PassK(BaseModel):
    """pass@k and pass^k at one k: of a task (its attempts), or of a cell (the mean over its tasks)."""

    k: int = Field(ge=1)
    pass_at_k: float | None = Field(description="at least one of k attempts succeeds; None: too few attempts")
    pass_hat_k: float | None = Field(description="all k attempts succeed (pass^k); None: too few attempts")
    tasks: int = Field(default=1, description="tasks with at least k attempts (a cell's mean is over these)")
    short: int = Field(default=0, description="tasks with fewer than k attempts: the mean leaves none out")


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """1 − C(n−c, k) / C(n, k): unbiased pass@k from n attempts with c successes; None when n < k."""
    _check(n, c, k)
    if n < k:
        return None
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float | None:
    """C(c, k) / C(n, k): unbiased pass^k (all k attempts succeed) from n attempts, c successes; None when n < k."""
    _check(n, c, k)
    if n < k:
        return None
    return math.comb(c, k) / math.comb(n, k)


def task_pass_k(n: int, c: int, k: int) -> PassK:
    """pass@k and pass^k of one task with n attempts, c of them successes."""
    return PassK(k=k, pass_at_k=pass_at_k(n, c, k), pass_hat_k=pass_hat_k(n, c, k), tasks=int(n >= k),
                 short=int(n < k))


def mean_pass_k(counts: list[tuple[int, int]], k: int) -> PassK:
    """The mean pass@k and pass^k over tasks given as (attempts, successes). Only when every task has at
    least k attempts: a mean over the tasks that happen to have enough would be a mean over other tasks (the
    ones that errored less), so otherwise both are None and `short` says how many tasks lack attempts."""
    per_task = [task_pass_k(n, c, k) for n, c in counts]
    ready = [one for one in per_task if one.pass_at_k is not None]
    short = len(per_task) - len(ready)
    if short or not ready:
        return PassK(k=k, pass_at_k=None, pass_hat_k=None, tasks=len(ready), short=short)
    return PassK(k=k, pass_at_k=sum(one.pass_at_k for one in ready) / len(ready),
                 pass_hat_k=sum(one.pass_hat_k for one in ready) / len(ready), tasks=len(ready))


def wilson_interval(successes: float, n: int, *, confidence: float = CONFIDENCE) -> Interval | None:
    """The Wilson score interval of the rate successes / n; None when n is 0. `successes` may be fractional
    (a mean rate times n). At 0 of n it runs from 0 to z²/(n+z²), at n of n from n/(n+z²) to 1."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # the bounds are exactly 0 and 1 at p = 0 and 1; rounding must not push them past
    return Interval(low=0.0 if p == 0 else max(0.0, centre - half), high=1.0 if p == 1 else min(1.0, centre + half),
                    confidence=confidence)


def _check(n: int, c: int, k: int) -> None:
    if k < 1 or n < 0 or not 0 <= c <= n:
        raise ValueError(f"need k ≥ 1 and 0 ≤ c ≤ n, got n={n}, c={c}, k={k}")
