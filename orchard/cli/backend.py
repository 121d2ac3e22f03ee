"""`orchard backend list`: every sandbox backend registered (built in or by a plugin package), what it can
enforce, and its config fields."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from orchard.cli.sandbox import out

app = typer.Typer(help="Sandbox backends: where `orchard serve --backend NAME` runs sandboxes.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every backend found through the `orchard.backends` entry points, with its capabilities (network
    modes, limits it enforces, image kinds) and the fields of its config (`orchard serve --backend-config`)."""
    from orchard.core.errors import OrchardError
    from orchard.sandbox.backends.registry import available_backends, backend_class, capabilities_of

    table = Table(title="backends")
    for column in ("name", "network modes", "limits", "images", "config fields"):
        table.add_column(column, overflow="fold")
    for name in available_backends():
        try:
            cls = backend_class(name)
            caps = capabilities_of(name)
        except OrchardError as exc:
            table.add_row(escape(name), f"[red]cannot load: {escape(str(exc))}[/]", "", "", "")
            continue
        fields = ", ".join(f for f in cls.Config.model_fields if f != "backend")
        table.add_row(escape(name), ", ".join(sorted(caps.network_modes)), ", ".join(sorted(caps.limits)),
                      ", ".join(sorted(caps.image_kinds)), escape(fields))
    out.print(table)
