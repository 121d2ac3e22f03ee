"""`orchard report DIR... --out report.html`: the harness × model matrix in the terminal and one
self-contained HTML page over evaluation runs (or a study's runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from orchard.cli.sandbox import fail, out
from orchard.core.errors import OrchardError


def report(
    runs: Annotated[list[Path], typer.Argument(
        help="Output directories of `orchard eval` runs or of an `orchard study` (all of its cells).")],
    out_file: Annotated[Path, typer.Option("--out", help="The HTML file to write.")] = Path("report.html"),
) -> None:
    """Print the harness × model matrix and write an HTML report of evaluation runs.

    First each run with its options (harness options, model settings, the suite's content hash). Then one
    cell per configuration — runs of the same configuration together, a task's rollouts its attempts: tasks,
    attempts per task, the resolve rate (the mean over tasks of each task's resolved ÷ attempts) with its 95%
    Wilson score interval (the tasks the sample), pass@k and pass^k when tasks have several attempts, errors
    and tasks not run apart (they are not attempts), and steps, tokens and wall time per attempt. Then the
    matrix per domain (swe, claw, ...): each harness × model over a domain's tasks of every suite it ran, with
    pass@k and pass^k. The HTML
    page adds pass@k and pass^k per task, each run's summary and every task's trajectory (steps, tool calls,
    observations, errors). No external assets: the file stands alone."""
    from orchard.eval.report import load_runs, unrun_cells, write_report

    try:
        loaded = load_runs(runs)
        unrun = unrun_cells(runs)
        write_report(loaded, out_file, unrun)
    except OrchardError as exc:
        fail(str(exc))
    print_runs(loaded)
    print_matrix(loaded, unrun)
    out.print(f"report of {len(loaded)} run(s): {escape(str(out_file))}")


def _console() -> Console:
    return out if out.is_terminal or os.environ.get("COLUMNS") else Console(width=200, highlight=False)


def print_runs(loaded) -> None:
    """Each run with its options, so that cells which differ only in them are told apart."""
    from orchard.eval.summary import runs_table

    if loaded:
        _console().print(runs_table([run.results for run in loaded]))


def print_matrix(loaded, unrun) -> None:
    from orchard.eval.domains import domain_rows
    from orchard.eval.matrix import matrix_rows
    from orchard.eval.summary import domain_table, matrix_table

    console = _console()
    rows = matrix_rows([run.results for run in loaded])
    if rows:
        console.print(matrix_table(rows))
        console.print("a cell is one configuration (suite content, harness + options, model + settings); tasks: "
                      "tasks attempted, att./task: attempts per task (a task's rollouts over the cell's runs); "
                      "rate = the mean over tasks of each task's resolved ÷ attempts; CI: 95% Wilson score "
                      "interval, the tasks the sample; pass@k / pass^k: at least one / all of k attempts resolve, "
                      "unbiased, the mean over tasks (n/a: a task has fewer than k attempts); errors are not "
                      "attempts; Δ: paired over the tasks both harnesses attempted (percentile bootstrap, "
                      "seeded)", style="dim")
    by_domain = domain_rows([run.results for run in loaded])
    if by_domain:
        console.print(domain_table(by_domain))
        console.print("a row pools one domain's tasks (swe, claw, ...: orchard.eval.domains) over the suites "
                      "each harness ran with each model, each task resolved at its suite's pass threshold; pass@k / pass^k: "
                      "at least one / all of k attempts resolve, the mean over the domain's tasks", style="dim")
    for cell in unrun:
        what = f"did not run: {cell.error}" if cell.error else "not run yet"
        console.print(f"[yellow]{escape(cell.harness)} × {escape(cell.model)} {escape(what)}[/]")
