"""`orchard model list`: every model Orchard runs itself (registered in the `orchard.models` entry-point
group, built in or by a plugin, or served at run time), as `orchard eval --model NAME` and the gateway find
them."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from orchard.cli.sandbox import out

app = typer.Typer(help="Orchard's own models: the policies the gateway serves by name (`orchard eval --model NAME`).",
                  no_args_is_help=True, pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every model found through the `orchard.models` entry points: built in, or added by a plugin. Gateway
    aliases and litellm model strings (any provider's models) are not listed: see docs/gateway.md."""
    from orchard.core.policy import ENTRY_POINT_GROUP
    from orchard.policies.registry import list_models

    models = list_models(load=True)
    table = Table(title="models")
    for column in ("name", "description", "source", "package", "entry point"):
        table.add_column(column, overflow="fold")
    for info in models:
        package = f"{info.distribution or '-'} {info.distribution_version or ''}".strip()
        description = (f"[red]cannot load: {escape(info.problem)}[/]" if info.problem
                       else escape(info.description or ""))
        table.add_row(escape(info.name), description, info.source, escape(package), escape(info.target or "-"))
    out.print(table)
    if not models:
        out.print(f"no model is registered: a package adds one with an entry point in the {ENTRY_POINT_GROUP!r} "
                  "group (see docs/models.md)")
