"""`orchard serve keys add|list|revoke`: the owner API keys of `orchard serve` (orchard/sandbox/server/api_keys.py).
A running server reads the key file again when it changes: no restart needed."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchard.cli.sandbox import err, fail, out
from orchard.core.errors import OrchardError

app = typer.Typer(no_args_is_help=True, help="Owner API keys: each acts for one owner, who sees and deletes only "
                                             "its own sandboxes, under the key's cap. The file holds only hashes.")

HomeOption = Annotated[Optional[Path], typer.Option(
    envvar="ORCHARD_HOME", show_envvar=True, help="The server's state directory (default ~/.orchard).")]
KeysFileOption = Annotated[Optional[Path], typer.Option(
    "--keys-file", envvar="ORCHARD_API_KEYS_FILE", show_envvar=True, dir_okay=False,
    help="The key file (default HOME/api-keys.json); the same as `orchard serve --keys-file`.")]
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _path(home: Path | None, keys_file: Path | None) -> Path:
    from orchard.sandbox.server.api_keys import keys_file as default_keys_file
    from orchard.sandbox.server.home import resolve_home

    return keys_file if keys_file is not None else default_keys_file(resolve_home(home))


def parse_expiry(text: str, now: float) -> float:
    """A duration (`90m`, `12h`, `30d`, `2w`) from now, or an ISO 8601 time (UTC when it names no zone)."""
    match = DURATION.match(text.strip())
    if match:
        return now + float(match.group(1)) * UNIT_S[match.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a duration (90m, 12h, 30d, 2w) nor an ISO 8601 time "
                                 "(2026-01-31 or 2026-01-31T12:00:00+00:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _when(ts: float | None) -> str:
    return "never" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@app.command("add")
def add(
    owner: Annotated[str, typer.Option(help="The owner every sandbox created with the key belongs to.")],
    max_sandboxes: Annotated[Optional[int], typer.Option(
        min=1, help="Most live sandboxes of this owner when created with this key (on top of the server's "
                    "--max-sandboxes-per-owner). Default: the server's cap only.")] = None,
    expires: Annotated[Optional[str], typer.Option(
        help="When the key stops working: a duration (90m, 12h, 30d, 2w) or an ISO 8601 time. Default: never.")
    ] = None,
    home: HomeOption = None,
    keys_file: KeysFileOption = None,
) -> None:
    """Add a key for OWNER and print it once (to stdout); only its hash is stored."""
    from orchard.sandbox.server.api_keys import add_key

    path = _path(home, keys_file)
    try:
        expires_at = parse_expiry(expires, time.time()) if expires is not None else None
        entry, key = add_key(path, owner, max_sandboxes=max_sandboxes, expires_at=expires_at)
    except OrchardError as exc:
        fail(str(exc), code=2)
    err.print(f"Key {entry.id} for owner {escape(entry.owner)} (max sandboxes: {entry.max_sandboxes or 'server cap'}"
              f", expires: {_when(entry.expires_at)}) added to {escape(str(path))}. It is shown only now:")
    out.print(key, soft_wrap=True)


@app.command("list")
def list_keys(home: HomeOption = None, keys_file: KeysFileOption = None) -> None:
    """The keys: id, owner, cap, expiry (never the keys themselves)."""
    from orchard.sandbox.server.api_keys import read_keys

    path = _path(home, keys_file)
    try:
        keys = read_keys(path).keys
    except OrchardError as exc:
        fail(str(exc), code=2)
    if not keys:
        err.print(f"No owner keys in {escape(str(path))}; add one with `orchard serve keys add --owner NAME`.")
        return
    now = time.time()
    for k in keys:
        state = "expired" if k.expired(now) else "active"
        out.print(f"{k.id}\t{escape(k.owner)}\tmax_sandboxes={k.max_sandboxes or '-'}\t"
                  f"expires={_when(k.expires_at)}\t{state}", soft_wrap=True)


@app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="The key's id, as `orchard serve keys list` shows it.")],
           home: HomeOption = None, keys_file: KeysFileOption = None) -> None:
    """Remove a key: a running server refuses it from its next request on."""
    from orchard.sandbox.server.api_keys import revoke_key

    path = _path(home, keys_file)
    try:
        entry = revoke_key(path, key_id)
    except OrchardError as exc:
        fail(str(exc), code=2)
    err.print(f"Revoked key {entry.id} of owner {escape(entry.owner)}.")
