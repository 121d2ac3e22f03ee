"""`orchard backend list`: every sandbox backend registered (built in or by a plugin package), what it can
enforce, and its config fields."""

from __future__ import annotations

import typer

from orchard.cli.plugins import print_plugins

app = typer.Typer(help="Sandbox backends: where `orchard serve --backend NAME` runs sandboxes.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every backend found through the `orchard.backends` entry points, with its capabilities (network
    modes, limits it enforces, image kinds) and the fields of its config (`orchard serve --backend-config`)."""
    from orchard.core.backend import ENTRY_POINT_GROUP
    from orchard.sandbox.backends.registry import list_backends

    print_plugins(list_backends(), title="backends", kind="backend", group=ENTRY_POINT_GROUP,
                  guide="docs/writing-a-backend.md", detail="capabilities and config fields")
