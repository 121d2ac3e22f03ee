"""The terminal view of a measurement: the same rows as the doc, as a rich table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bench.results_model import MeasurementResult, format_figure

_VERDICT = {True: "[green]pass[/]", False: "[red]miss[/]", None: "[dim]—[/]"}


def print_measurement(console: Console, result: MeasurementResult) -> None:
    table = Table(title=f"{result.title} ({result.duration_s:.0f} s{', quick' if result.quick else ''})",
                  title_justify="left")
    for column in ("metric", "Orchard", "peers", "ratio", "target", "result"):
        table.add_column(column)
    for row in result.rows:
        table.add_row(
            row.metric,
            f"{format_figure(row.ours)} {row.unit}",
            "\n".join(f"{k} {format_figure(v)} {row.unit}" for k, v in row.peers.items()) or "—",
            "\n".join(f"{k} {format_figure(v)}×" for k, v in row.ratios.items()) or "—",
            row.target_text() or "—",
            _VERDICT[row.passed],
        )
    console.print(table)
    for note in result.notes:
        console.print(f"  [dim]• {note}[/]")
