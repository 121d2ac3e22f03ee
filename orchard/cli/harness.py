"""`orchard harness list`: every harness registered (built in or by a plugin package), with the version each
records in its trajectories."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from orchard.cli.sandbox import out

app = typer.Typer(help="Harnesses: the agent loops `orchard eval --harness NAME` can run.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every harness found through the `orchard.harnesses` entry points: built in, or added by a plugin."""
    from orchard.core.harness import ENTRY_POINT_GROUP, list_harnesses

    harnesses = list_harnesses(load=True)
    table = Table(title="harnesses")
    for column in ("name", "version", "source", "package", "entry point"):
        table.add_column(column, overflow="fold")
    for info in harnesses:
        package = f"{info.distribution or '-'} {info.distribution_version or ''}".strip()
        version = info.version or f"[red]cannot import: {escape(info.problem or '?')}[/]"
        table.add_row(escape(info.name), version if info.problem else escape(version), info.source,
                      escape(package), escape(info.target))
    out.print(table)
    if not harnesses:
        out.print(f"no harness is registered: a package adds one with an entry point in the {ENTRY_POINT_GROUP!r} "
                  "group (see docs/harness-adapters.md)")
