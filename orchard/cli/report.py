"""`orchard report DIR... --out report.html`: one self-contained HTML page over evaluation runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orchard.cli.sandbox import fail, out
from orchard.core.errors import OrchardError


def report(
    runs: Annotated[list[Path], typer.Argument(help="Output directories of `orchard eval` runs.")],
    out_file: Annotated[Path, typer.Option("--out", help="The HTML file to write.")] = Path("report.html"),
) -> None:
    """Write an HTML report of evaluation runs.

    A harness × model matrix of resolve rates, each run's summary, and every task's trajectory (steps, tool
    calls, observations, errors). No external assets: the file stands alone."""
    from orchard.eval.report import load_runs, write_report

    try:
        loaded = load_runs(runs)
        write_report(loaded, out_file)
    except OrchardError as exc:
        fail(str(exc))
    out.print(f"report of {len(loaded)} run(s): {escape(str(out_file))}")
