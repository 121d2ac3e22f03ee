"""The `orchard` command. Thin: parses arguments, shows results, calls the library."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchard import __version__
from orchard.cli import eval as eval_cli
from orchard.cli import gateway as gateway_cli
from orchard.cli import harness as harness_cli
from orchard.cli import report as report_cli
from orchard.cli import sandbox as sandbox_cli
from orchard.cli.sandbox import err, fail, out
from orchard.core.errors import OrchardError
from orchard.sandbox.backends.registry import available_backends

app = typer.Typer(name="orchard", no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Orchard: sandboxes for LLM agents, one trajectory schema, training recipes.")
app.add_typer(sandbox_cli.app, name="sandbox")
app.add_typer(eval_cli.app, name="eval")
app.add_typer(harness_cli.app, name="harness")
app.command("report")(report_cli.report)
app.command("gateway")(gateway_cli.gateway)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"orchard {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """Orchard: sandboxes for LLM agents, one trajectory schema, training recipes."""


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8700,
    backend: Annotated[str, typer.Option(
        help=f"Where sandboxes run: {', '.join(available_backends())} (local: bubblewrap on this machine).")
    ] = "local",
    api_key: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_API_KEY", show_envvar=True,
        help="Key clients must send as 'Authorization: Bearer KEY'. Generated and printed once if not given.")
    ] = None,
    home: Annotated[Optional[Path], typer.Option(
        envvar="ORCHARD_HOME", show_envvar=True, help="State directory (default ~/.orchard).")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the Orchard server: the REST API that creates, lists and deletes sandboxes (docs at /docs).

    Sandboxes outlive the server; a server restarted on the same --home takes them over again."""
    from orchard.sandbox.server.main import serve as run_server  # heavy imports only when serving

    generated = not api_key
    key = api_key or secrets.token_urlsafe(24)
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    err.print(f"Orchard server on http://{escape(host)}:{port} (backend {escape(backend)}). Clients use:")
    # Printed to stdout, one per line, so that scripts can pick them up.
    out.print(f"export ORCHARD_URL=http://{escape(url_host)}:{port}", soft_wrap=True)
    if generated:
        out.print(f"export ORCHARD_API_KEY={escape(key)}", soft_wrap=True)
        err.print("[yellow]The API key above was generated for this run and is not shown again; "
                  "pass --api-key or set ORCHARD_API_KEY to choose one.[/]")
    try:
        run_server(host=host, port=port, backend_name=backend, api_key=key, home=home, log_level=log_level)
    except OrchardError as exc:
        fail(str(exc))


if __name__ == "__main__":
    app()
