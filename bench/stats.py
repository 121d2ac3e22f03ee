"""Latency summaries. Percentiles use the inclusive (linear interpolation) method, the same as numpy's
default, so figures compare with other tools' p50/p99."""

from __future__ import annotations

import statistics

from pydantic import BaseModel


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0 < q < 100) of `samples`, linearly interpolated between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 < q < 100:
        raise ValueError(f"percentile q must be in (0, 100), got {q}")
    if len(samples) == 1:
        return samples[0]
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class LatencyStats(BaseModel):
    """A latency distribution in milliseconds."""

    n: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def from_seconds(cls, samples_s: list[float]) -> "LatencyStats":
        ms = [s * 1000 for s in samples_s]
        return cls(n=len(ms), p50_ms=percentile(ms, 50), p99_ms=percentile(ms, 99),
                   mean_ms=statistics.fmean(ms), min_ms=min(ms), max_ms=max(ms))
