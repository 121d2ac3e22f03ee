"""The `orchard` command. Thin: parses arguments, shows results, calls the library."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.markup import escape

from orchard import __version__
from orchard.cli import backend as backend_cli
from orchard.cli import eval as eval_cli
from orchard.cli import export as export_cli
from orchard.cli import gateway as gateway_cli
from orchard.cli import harness as harness_cli
from orchard.cli import image as image_cli
from orchard.cli import model as model_cli
from orchard.cli import report as report_cli
from orchard.cli import sandbox as sandbox_cli
from orchard.cli import serve_keys as serve_keys_cli
from orchard.cli import study as study_cli
from orchard.cli import train as train_cli
from orchard.cli.sandbox import err, fail, out
from orchard.core.errors import InvalidRequest, OrchardError, describe_validation_errors
from orchard.sandbox.backends.registry import available_backends

app = typer.Typer(name="orchard", no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Orchard: sandboxes for LLM agents, one trajectory schema, training recipes.")
app.add_typer(sandbox_cli.app, name="sandbox")
app.add_typer(eval_cli.app, name="eval")
app.add_typer(harness_cli.app, name="harness")
app.add_typer(image_cli.app, name="image")
app.add_typer(model_cli.app, name="model")
app.add_typer(backend_cli.app, name="backend")
app.add_typer(export_cli.app, name="export")
app.add_typer(train_cli.app, name="train")
app.add_typer(study_cli.app, name="study")
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


def _pools_file(path: Path):
    """`--pools FILE` as a PoolsConfig, with errors that name the file."""
    from orchard.core.pool import PoolsConfig
    from orchard.util.config_files import read_config_file

    try:
        return PoolsConfig.model_validate(read_config_file(path, "pools file"))
    except ValidationError as exc:
        raise InvalidRequest(f"pools file {path}: {describe_validation_errors(exc, 'pools')}") from None

serve_app = typer.Typer(name="serve")
app.add_typer(serve_app, name="serve")
serve_app.add_typer(serve_keys_cli.app, name="keys")


@serve_app.callback(invoke_without_command=True)
def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8700,
    backend: Annotated[Optional[str], typer.Option(
        help=f"Where sandboxes run: {', '.join(available_backends())} (default local: bubblewrap on this machine; "
             "`orchard backend list` shows what each enforces). Its settings come from the environment "
             "(e.g. ORCHARD_K8S_*, DOCKER_HOST) unless --backend-config is given.")
    ] = None,
    backend_config: Annotated[Optional[Path], typer.Option(
        dir_okay=False, help="A JSON or YAML file with the backend's config: a mapping with 'backend' (its "
                             "name) and any of its fields (`orchard backend list` names them); fields not "
                             "given keep the defaults from the environment.")] = None,
    model_gateway: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MODEL_GATEWAY", show_envvar=True,
        help="The model gateway sandboxes with network.gateway (mode 'model') reach at 127.0.0.1:4000 inside: "
             "unix:/PATH of its socket for local and docker, http://HOST:PORT for kubernetes; sets the backend "
             "config's model_gateway. See docs/networking.md.")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option(
        envvar="ORCHARD_API_KEY_FILE", show_envvar=True, dir_okay=False,
        help="File holding the admin key clients send as 'Authorization: Bearer KEY' (or set ORCHARD_API_KEY): "
             "it acts for any owner. Generated and printed once if neither is given.")] = None,
    keys_file: Annotated[Optional[Path], typer.Option(
        "--keys-file", envvar="ORCHARD_API_KEYS_FILE", show_envvar=True, dir_okay=False,
        help="Owner API keys (default HOME/api-keys.json), managed with `orchard serve keys add|list|revoke`: "
             "each key is bound to one owner, who sees and deletes only its own sandboxes under the key's cap, "
             "whatever owner a request names. The file holds hashes only; changes apply without a restart.")
    ] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", hidden=True, help="Refused: a key on the command line is visible to every user in ps.")
    ] = None,
    home: Annotated[Optional[Path], typer.Option(
        envvar="ORCHARD_HOME", show_envvar=True, help="State directory (default ~/.orchard).")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    max_cpu: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MAX_CPU", show_envvar=True,
        help="Most CPU cores a sandbox may ask for ('none': no maximum). Default (local): this machine's cores.")
    ] = None,
    max_memory_mb: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MAX_MEMORY_MB", show_envvar=True,
        help="Most memory_mb a sandbox may ask for. Default (local): this machine's memory.")] = None,
    max_disk_mb: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MAX_DISK_MB", show_envvar=True,
        help="Most disk_mb a sandbox may ask for. Default (local): the smaller of this machine's memory (the "
             "writable layer is a tmpfs) and the free space under --home.")] = None,
    max_processes: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MAX_PROCESSES", show_envvar=True,
        help="Most max_processes a sandbox may ask for. Default (local): the kernel's pid_max.")] = None,
    max_timeout_s: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MAX_TIMEOUT_S", show_envvar=True,
        help="Longest timeout_s (TTL) and heartbeat_timeout_s a sandbox may ask for. Default: 7 days.")] = None,
    max_sandboxes: Annotated[Optional[int], typer.Option(
        envvar="ORCHARD_MAX_SANDBOXES", show_envvar=True, min=1,
        help="Most live sandboxes (creating, ready or being deleted) at once, over every orchestrator sharing "
             "--home. Default: no cap.")] = None,
    max_sandboxes_per_owner: Annotated[Optional[int], typer.Option(
        envvar="ORCHARD_MAX_SANDBOXES_PER_OWNER", show_envvar=True, min=1,
        help="Most live sandboxes of one owner (an owner key's owner; with the admin key, the owner a create "
             "names, else 'default'). Default: no cap.")
    ] = None,
    max_creates_per_s: Annotated[Optional[float], typer.Option(
        envvar="ORCHARD_MAX_CREATES_PER_S", show_envvar=True, min=0.001,
        help="Most creates a second, sustained (bursts of --create-burst). Default: no limit.")] = None,
    create_burst: Annotated[Optional[int], typer.Option(
        envvar="ORCHARD_CREATE_BURST", show_envvar=True, min=1,
        help="Creates allowed at once above --max-creates-per-s. Default: one second's worth.")] = None,
    create_wait_s: Annotated[float, typer.Option(
        envvar="ORCHARD_CREATE_WAIT_S", show_envvar=True, min=0,
        help="How long a create over a cap waits for a place before it is refused with 429.")] = 10.0,
    pools: Annotated[Optional[Path], typer.Option(
        envvar="ORCHARD_POOLS", show_envvar=True,
        help="Warm pools of pre-started sandboxes: a YAML or JSON file `pools: [{name, spec, min_ready, ...}]` "
             "(docs/pools.md). A create whose spec has a pool's template is claimed from it.")] = None,
    max_connections: Annotated[Optional[int], typer.Option(
        envvar="ORCHARD_MAX_CONNECTIONS", show_envvar=True, min=1,
        help="Most client connections at once; at the cap a new one replaces the oldest idle one that never "
             "authenticated. Default: half the file descriptors the process may open (at most 4096).")] = None,
    request_timeout_s: Annotated[float, typer.Option(
        envvar="ORCHARD_REQUEST_TIMEOUT_S", show_envvar=True, min=0.001,
        help="How long a connection may take to send its next whole request (headers and body) before it is "
             "closed.")] = 30.0,
) -> None:
    """Run the Orchard server: the REST API that creates, lists and deletes sandboxes (docs at /docs).

    Sandboxes outlive the server; a server restarted on the same --home takes them over again. A sandbox
    asking for more than a --max-* value is refused (400), as is one asking for a limit the backend cannot
    enforce. Over --max-sandboxes, --max-sandboxes-per-owner or --max-creates-per-s a create waits up to
    --create-wait-s for a place, then is refused (429).

    Keys: the admin key (ORCHARD_API_KEY or --api-key-file) acts for any owner; owner keys
    (`orchard serve keys add --owner NAME`) act for their owner only. Requests without a valid key are
    refused (401) before their body is read."""
    if ctx.invoked_subcommand is not None:  # `orchard serve keys ...`
        return
    from orchard.sandbox.server.admission import CreateCaps
    from orchard.sandbox.server.home import resolve_home
    from orchard.sandbox.server.main import serve as run_server  # heavy imports only when serving
    from orchard.sandbox.server.spec_limits import spec_limits
    from orchard.util.connection_guard import ConnectionLimits

    if api_key is not None:
        fail("--api-key is not accepted: a key on the command line is visible to every user of this machine "
             "(ps, /proc). Set ORCHARD_API_KEY or pass --api-key-file FILE instead.", code=2)
    key = read_api_key_file(api_key_file) if api_key_file else os.environ.get("ORCHARD_API_KEY", "").strip()
    try:
        config = _backend_config(backend, backend_config, resolve_home(home), model_gateway)
        limits = spec_limits(config, resolve_home(home), {
            "cpu": max_cpu, "memory_mb": max_memory_mb, "disk_mb": max_disk_mb, "max_processes": max_processes,
            "timeout_s": max_timeout_s})
        caps = CreateCaps(max_sandboxes=max_sandboxes, max_sandboxes_per_owner=max_sandboxes_per_owner,
                          max_creates_per_s=max_creates_per_s, create_burst=create_burst, wait_s=create_wait_s)
        pools_config = _pools_file(pools) if pools is not None else None
        connections = ConnectionLimits(max_connections=max_connections, idle_timeout_s=request_timeout_s)
    except OrchardError as exc:
        fail(str(exc), code=2)
    except ValidationError as exc:
        fail(f"invalid caps: {describe_validation_errors(exc, 'caps')}", code=2)
    generated = not key
    key = key or secrets.token_urlsafe(24)
    url_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    err.print(f"Orchard server on http://{escape(host)}:{port} (backend {escape(config.backend)}). Clients use:")
    # Printed to stdout, one per line, so that scripts can pick them up.
    out.print(f"export ORCHARD_URL=http://{escape(url_host)}:{port}", soft_wrap=True)
    if generated:
        out.print(f"export ORCHARD_API_KEY={escape(key)}", soft_wrap=True)
        err.print("[yellow]The API key above was generated for this run and is not shown again; "
                  "set ORCHARD_API_KEY or pass --api-key-file to choose one.[/]")
    try:
        run_server(host=host, port=port, backend=config, api_key=key, home=home, log_level=log_level,
                   limits=limits, caps=caps, pools=pools_config, api_keys_file=keys_file, connections=connections)
    except OrchardError as exc:
        fail(str(exc))


def _backend_config(name: str | None, path: Path | None, home: Path, model_gateway: str | None = None):
    """The config `orchard serve` runs: from --backend-config when given (its 'backend' must agree with
    --backend when both are given), else backend `name`'s defaults (default local); `model_gateway`, when
    given, replaces the config's."""
    from orchard.sandbox.backends.registry import backend_config, parse_backend_config
    from orchard.util.config_files import read_config_file

    if path is None:
        config = backend_config(name or "local", home)
        if model_gateway is None:
            return config
        return parse_backend_config({**config.model_dump(), "model_gateway": model_gateway}, home)
    data = read_config_file(path, "backend config")
    if model_gateway is not None:
        data["model_gateway"] = model_gateway
    data.setdefault("backend", name or "local")
    if name is not None and data["backend"] != name:
        raise InvalidRequest(f"--backend {name} but the backend config {path} is for {data['backend']!r}; "
                             "give one of them")
    return parse_backend_config(data, home)


def read_api_key_file(path: Path) -> str:
    try:
        key = path.read_text().strip()
    except OSError as exc:
        fail(f"cannot read the API key file {path}: {exc.strerror or exc}", code=2)
    if not key:
        fail(f"the API key file {path} is empty; put the key in it", code=2)
    if path.stat().st_mode & 0o077:
        err.print(f"[yellow]warning: the API key file {escape(str(path))} is readable by other users; "
                  "chmod 600 it.[/]")
    return key


if __name__ == "__main__":
    app()
