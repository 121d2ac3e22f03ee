"""`orchard harness list`: every harness registered (built in or by a plugin package), with the version each
records in its trajectories."""

from __future__ import annotations

import typer
from rich.markup import escape

from orchard.cli.plugins import print_plugins

app = typer.Typer(help="Harnesses: the agent loops `orchard eval --harness NAME` can run.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every harness found through the `orchard.harnesses` entry points: built in, or added by a plugin."""
    from orchard.core.harness import ENTRY_POINT_GROUP, list_harnesses

    print_plugins(list_harnesses(load=True), title="harnesses", kind="harness", group=ENTRY_POINT_GROUP,
                  guide="docs/harness-adapters.md", detail="version", detail_of=_version)


def _version(info) -> str:
    if info.problem:
        return f"[red]cannot import: {escape(info.problem)}[/]"
    return escape(info.version or "")
