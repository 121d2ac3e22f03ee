"""What a bench run produces: rows (our figure, peers' figures, ratios, targets) per measurement, and the
JSON file that keeps the latest result of every measurement (`--only` updates one, keeps the others)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from orchard.core.atomic_write import atomic_write_text

from bench.machine import MachineInfo
from bench.stats import LatencyStats

Comparison = Literal["<=", ">=", "<", ">"]
_SYMBOLS = {"<=": "≤", ">=": "≥", "<": "<", ">": ">"}
OURS = "value"  # a Target on OURS checks our own figure; any other name checks that ratio of the row


class Target(BaseModel):
    """A goal for one figure of a row: our value, or one of its ratios, compared with `limit`."""

    on: str = OURS
    op: Comparison
    limit: float

    def met_by(self, row: "Row") -> bool:
        figure = row.ours if self.on == OURS else row.ratios[self.on]
        return {"<=": figure <= self.limit, ">=": figure >= self.limit,
                "<": figure < self.limit, ">": figure > self.limit}[self.op]

    def describe(self, unit: str) -> str:
        op = _SYMBOLS[self.op]
        if self.on == OURS:
            return f"{op} {format_figure(self.limit)} {unit}".rstrip()
        return f"{self.on} {op} {format_figure(self.limit)}×"


class Row(BaseModel):
    """One figure of ours beside the same figure of each peer. Ratios are named `a/b` and say which way
    they divide; `peers` may be empty where no peer does the same thing."""

    metric: str
    unit: str
    ours: float
    peers: dict[str, float] = Field(default_factory=dict)
    ratios: dict[str, float] = Field(default_factory=dict)
    targets: list[Target] = Field(default_factory=list)

    @property
    def passed(self) -> bool | None:
        """None when the row is informational (no target)."""
        if not self.targets:
            return None
        return all(target.met_by(self) for target in self.targets)

    def target_text(self) -> str:
        return "; ".join(target.describe(self.unit) for target in self.targets)


class Findings(BaseModel):
    """What one measurement function returns; the runner adds when, where and how long."""

    rows: list[Row]
    notes: list[str] = Field(default_factory=list)
    latencies: dict[str, LatencyStats] = Field(default_factory=dict)


class MeasurementResult(Findings):
    name: str
    title: str
    method: str
    quick: bool
    measured_at: str
    duration_s: float
    machine: MachineInfo
    load_average_1m: float = Field(description="the host's 1-minute load average when the measurement began")

    @property
    def passed(self) -> bool:
        return all(row.passed is not False for row in self.rows)


class BenchResults(BaseModel):
    measurements: dict[str, MeasurementResult] = Field(default_factory=dict)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("inf")


def format_figure(value: float) -> str:
    """Three significant digits or so, without exponent notation (2.50, 12.3, 126, 2,480); whole
    numbers (counts, limits) without decimals."""
    if float(value).is_integer():
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def load_results(path: Path) -> BenchResults:
    """The results kept so far; empty when there is no file or it was written by an older bench."""
    try:
        return BenchResults.model_validate_json(path.read_text())
    except FileNotFoundError:
        return BenchResults()
    except ValidationError:
        return BenchResults()


def save_results(path: Path, results: BenchResults) -> None:
    """Write atomically so an interrupted run never leaves half a JSON file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, results.model_dump_json(indent=2) + "\n")
