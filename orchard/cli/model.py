"""`orchard model list`: every model Orchard runs itself (registered in the `orchard.models` entry-point
group, built in or by a plugin, or served at run time), as `orchard eval --model NAME` and the gateway find
them."""

from __future__ import annotations

import typer

from orchard.cli.plugins import print_plugins

app = typer.Typer(help="Orchard's own models: the policies the gateway serves by name (`orchard eval --model NAME`).",
                  no_args_is_help=True, pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every model found through the `orchard.models` entry points: built in, or added by a plugin. Gateway
    aliases and litellm model strings (any provider's models) are not listed: see docs/gateway.md."""
    from orchard.core.policy import ENTRY_POINT_GROUP
    from orchard.policies.registry import list_models

    print_plugins(list_models(load=True), title="models", kind="model", group=ENTRY_POINT_GROUP, guide="docs/models.md",
                  detail="description")
