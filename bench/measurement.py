"""What a measurement is to the runner: a name for `--only`, a title and method text for the report, and a
function that does the work and returns its rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich.console import Console

from bench.results_model import Findings


@dataclass(frozen=True)
class BenchContext:
    quick: bool
    console: Console

    def pick(self, full: int, quick: int) -> int:
        """The size of a loop: `full` for `make bench`, `quick` for `--quick`."""
        return quick if self.quick else full


@dataclass(frozen=True)
class Measurement:
    name: str
    title: str
    method: str  # how it is measured, one paragraph of Markdown for the report
    run: Callable[[BenchContext], Findings]
