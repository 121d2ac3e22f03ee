"""Credit assignment on failed rollouts, the arithmetic: from per-step hindsight values to the steps worth
training and their weights. No I/O: the values come from proxies.py (and optionally a judge).

- **values** v_1..v_T: how close the rollout was to the solution after each agent step (0..1), with v_0 the
  value before any step (the task's starting state).
- **smoothed** backwards, as a discounted return: s_T = v_T, s_t = (1 − λ)·v_t + λ·s_{t+1}. A step's value
  then also reflects what the next steps reached, so the steps leading up to a gain (finding the file,
  reading it) share its credit, and steps after it get none. λ = 0 is no smoothing.
- **Δ_t** = s_t − s_{t−1} (s_0 = v_0).
- **ascent segments**: maximal runs of consecutive steps with Δ_t ≥ δ, up to the value peak (the first step
  where s is highest; nothing after it), whose total gain ΣΔ is at least Γ.
- **weights**: a step of a segment is trained with weight min(max_weight, scale·Δ_t); steps that submit are
  never trained (the failed submission), whatever their Δ."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class CreditSettings(BaseModel):
    """How values become step weights, and how much failure-derived data training may take."""

    model_config = ConfigDict(extra="forbid")

    smoothing: float = Field(default=0.5, ge=0, lt=1, description="λ of the backward smoothing; 0 = none")
    min_delta: float = Field(default=0.02, gt=0, description="δ: the least Δ of a step in an ascent segment")
    min_gain: float = Field(default=0.1, ge=0, description="Γ: the least total gain of an ascent segment")
    weight_scale: float = Field(default=1.0, gt=0, description="a step's weight is weight_scale × Δ ...")
    max_weight: float = Field(default=1.0, gt=0, description="... at most this (resolved rollouts train at 1.0)")
    max_failure_share: float = Field(default=0.3, ge=0, le=1, description=(
        "at most this share of the trained tokens comes from failed rollouts; the lowest-weight steps go first"))
    proxy_weights: dict[str, float] = Field(
        default_factory=lambda: {"diff_overlap": 0.5, "tests_passing": 0.3, "gold_files_opened": 0.2},
        description="how the proxies (and `judge`, when used) are mixed into one value; missing ones are "
                    "left out and the rest renormalised")
    run_tests: bool = Field(default=True, description="replay prefixes and run FAIL_TO_PASS (the costly proxy)")
    max_test_runs: int = Field(default=6, ge=1, description="distinct working-tree diffs tested per rollout at most")


@dataclass(frozen=True)
class Segment:
    start: int  # index into the step sequence (0-based), inclusive
    end: int  # inclusive
    gain: float


def smooth(values: Sequence[float], smoothing: float) -> list[float]:
    """Backward exponential smoothing (see the module docstring)."""
    smoothed = [0.0] * len(values)
    following = None
    for index in range(len(values) - 1, -1, -1):
        value = values[index]
        following = value if following is None else (1 - smoothing) * value + smoothing * following
        smoothed[index] = following
    return smoothed


def deltas(smoothed: Sequence[float], start_value: float = 0.0) -> list[float]:
    previous, result = start_value, []
    for value in smoothed:
        result.append(value - previous)
        previous = value
    return result


def peak_index(smoothed: Sequence[float]) -> int:
    """The first index where the smoothed value is highest (-1 for no steps)."""
    if not smoothed:
        return -1
    best = max(smoothed)
    return next(i for i, value in enumerate(smoothed) if value == best)


def ascent_segments(steps_delta: Sequence[float], peak: int, *, min_delta: float, min_gain: float) -> list[Segment]:
    """Maximal runs of Δ ≥ min_delta ending at or before `peak` whose gain is at least min_gain."""
    segments, start = [], None
    for index in range(peak + 1):
        rising = steps_delta[index] >= min_delta
        if rising and start is None:
            start = index
        if start is not None and (not rising or index == peak):
            end = index if rising else index - 1
            gain = sum(steps_delta[start:end + 1])
            if gain >= min_gain:
                segments.append(Segment(start, end, gain))
            start = None
    return segments


def segment_weights(steps_delta: Sequence[float], segments: Sequence[Segment], submits: Sequence[bool],
                    settings: CreditSettings) -> dict[int, float]:
    """index -> weight for the steps of `segments`; never a submitting step."""
    weights = {}
    for segment in segments:
        for index in range(segment.start, segment.end + 1):
            if submits[index]:
                continue
            weights[index] = min(settings.max_weight, settings.weight_scale * steps_delta[index])
    return weights


def mix(proxies: dict[str, Sequence[float]], weights: dict[str, float]) -> list[float]:
    """The per-step weighted mean of the proxies present (weights renormalised over them)."""
    present = {name: values for name, values in proxies.items() if weights.get(name, 0) > 0}
    if not present:
        raise ValueError(f"no proxy to mix: have {sorted(proxies)}, weights {weights}")
    total = sum(weights[name] for name in present)
    length = len(next(iter(present.values())))
    return [sum(weights[name] * values[i] for name, values in present.items()) / total for i in range(length)]
