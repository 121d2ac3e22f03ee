"""`orchard sandbox ...`: create, exec, copy, list and delete sandboxes on an Orchard server.

Thin over the SDK (`AsyncOrchard`): each command parses its arguments, makes one call, prints the result.
Sandboxes made here must outlive the command, so every command needs a server (`orchard serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Awaitable, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard.core.errors import InvalidRequest, OrchardError
from orchard.core.sandbox import FileInfo, NetworkPolicy, SandboxInfo

app = typer.Typer(help="Create, use and delete sandboxes on an Orchard server (see `orchard serve`).",
                  no_args_is_help=True, pretty_exceptions_enable=False)
# Message lines are never wrapped: an error or a path is one line that scripts and tests can match, whatever
# the terminal's width or the length of the paths it names (tables still fit the width: they wrap in cells).
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

UrlOption = Annotated[Optional[str], typer.Option(
    "--url", envvar="ORCHARD_URL", show_envvar=True, help="Orchard server URL, e.g. http://127.0.0.1:8700.")]


def _warn_about_a_visible_key(ctx: typer.Context, param: typer.CallbackParam,
                              value: Optional[str]) -> Optional[str]:
    """A key given as --api-key is readable by every user of the machine (ps, /proc/PID/cmdline)."""
    source = ctx.get_parameter_source(param.name) if param.name else None
    if value and getattr(source, "name", None) == "COMMANDLINE":  # typer may bundle its own click: by name
        err.print("[bold yellow]warning:[/] --api-key on the command line is visible to every user of this "
                  "machine (ps); set ORCHARD_API_KEY instead.")
    return value


ApiKeyOption = Annotated[Optional[str], typer.Option(
    "--api-key", envvar="ORCHARD_API_KEY", show_envvar=True, callback=_warn_about_a_visible_key,
    help="API key of the server; prefer ORCHARD_API_KEY (a key on the command line shows in ps).")]

NO_SERVER = ("no Orchard server given. Sandboxes made by the CLI must outlive the command, and a sandbox "
             "without a server (embedded) dies with the process that made it. Start a server with "
             "`orchard serve` (it prints its URL and API key), then set ORCHARD_URL and ORCHARD_API_KEY.")

# `ID:path` names a path in a sandbox; anything else is a local path (write ./a:b for a local name with ':').
_SANDBOX_PATH = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*):(.*)$")


def run(url: str | None, api_key: str | None, action: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run `action(orchard_client)` against the server; an OrchardError becomes a red line and exit 1."""
    from orchard.sandbox.client import AsyncOrchard  # imported here so that `--help` stays fast

    async def main() -> Any:
        if not url:
            raise InvalidRequest(NO_SERVER)
        async with AsyncOrchard(url, api_key) as orch:
            return await action(orch)

    try:
        return asyncio.run(main())
    except OrchardError as exc:
        fail(str(exc))
    except OSError as exc:  # a local file that cannot be read or written (cp)
        fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def fail(message: str, code: int = 1) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def key_values(pairs: list[str], option: str) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"{option} {pair!r} is not KEY=VALUE")
        result[key] = value
    return result


@app.command()
def create(
    image: Annotated[str, typer.Option(help="`host` (the host's root, read-only) or a rootfs path / OCI image, "
                                            "depending on the server's backend.")] = "host",
    cpu: Annotated[Optional[float], typer.Option(help="CPU cores (quota); unlimited if not given.")] = None,
    memory_mb: Annotated[Optional[int], typer.Option(help="Memory limit in MiB.")] = None,
    disk_mb: Annotated[Optional[int], typer.Option(help="Size of the writable workdir in MiB.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds until the sandbox is deleted (its TTL).")] = 3600,
    network: Annotated[str, typer.Option(help="Egress: none (loopback only), open, or allowlist (see --allow).")
                       ] = "none",
    allow: Annotated[Optional[list[str]], typer.Option(
        help="host[:port] or CIDR the sandbox may reach with --network allowlist; repeatable.")] = None,
    env: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE environment variable; repeatable.")] = None,
    label: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE label; repeatable.")] = None,
    workdir: Annotated[str, typer.Option(help="Writable working directory inside the sandbox.")] = "/workspace",
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Create a sandbox and print its id. It lives until `orchard sandbox rm ID` or its --timeout."""
    if network not in ("none", "open", "allowlist"):
        fail(f"--network must be none, open or allowlist, not {network!r}")
    fields = dict(image=image, cpu=cpu, memory_mb=memory_mb, disk_mb=disk_mb, timeout_s=timeout,
                  env=key_values(env or [], "--env"), labels=key_values(label or [], "--label"), workdir=workdir)

    async def action(orch) -> str:
        try:
            policy = NetworkPolicy(mode=network, allow=allow or [])
        except ValueError as exc:
            raise InvalidRequest(f"bad --network/--allow: {exc}") from exc
        sandbox = await orch.create(detach=True, network=policy, **fields)
        await sandbox.close()
        return sandbox.id

    out.print(run(url, api_key, action))


@app.command(name="exec")
def exec_(
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="The sandbox.")],
    command: Annotated[list[str], typer.Argument(
        metavar="CMD", help="After --. One argument runs under /bin/sh -c (pipes, &&, globs); several run as argv.")],
    cwd: Annotated[Optional[str], typer.Option(help="Working directory (default: the sandbox's workdir).")] = None,
    env: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE for this command; repeatable.")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Seconds; then the command's processes are killed "
                                                          "and the exit code is 124.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Run a command in a sandbox, streaming its stdout and stderr; exits with the command's exit code.

    Example: orchard sandbox exec ID -- python3 -c 'print(1)'"""
    environment = key_values(env or [], "--env")

    async def action(orch) -> int:
        argv: str | list[str] = command[0] if len(command) == 1 else command
        result = None
        async with await orch.connect(sandbox_id) as sandbox:
            events = sandbox.exec_stream(argv, cwd=cwd, env=environment or None, timeout=timeout)
            async with contextlib.aclosing(events):
                async for event in events:
                    if event.kind == "exit":
                        result = event.result
                        break
                    stream = sys.stdout if event.kind == "stdout" else sys.stderr
                    stream.write(event.data)
                    stream.flush()
        if result is None:
            raise OrchardError("the sandbox's agent ended the output stream without an exit status")
        if result.timed_out:
            err.print(f"[bold red]error:[/] the command ran past --timeout {timeout} s and was killed")
            return 124
        code = result.exit_code
        return 1 if code is None else (128 - code if code < 0 else code)

    raise typer.Exit(run(url, api_key, action))


def split_sandbox_path(arg: str) -> tuple[str | None, str]:
    match = _SANDBOX_PATH.match(arg)
    return (match.group(1), match.group(2) or ".") if match else (None, arg)


@app.command()
def cp(
    src: Annotated[str, typer.Argument(metavar="SRC", help="Local path or ID:path.")],
    dst: Annotated[str, typer.Argument(metavar="DST", help="Local path or ID:path; ending in / means 'into this directory'.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    max_bytes: Annotated[int, typer.Option(
        "--max-bytes", min=0, help="Most bytes a copy out of a sandbox may write here; a larger one is stopped "
                                   "and nothing is kept.")] = 1 << 30,  # the SDK's DOWNLOAD_MAX_BYTES
) -> None:
    """Copy a file or directory into or out of a sandbox. Exactly one side is ID:path.

    DST names the copy itself (`cp dir ID:/workspace/dir`), unless it ends with / (`cp f.txt ID:/tmp/`).
    Relative sandbox paths are under the sandbox's workdir; write ./a:b for a local name containing ':'.
    A copy out of a sandbox writes at most --max-bytes (1 GiB), plain data only: setuid/setgid bits are
    dropped, owners are not applied, device nodes and FIFOs are refused."""
    (src_id, src_path), (dst_id, dst_path) = split_sandbox_path(src), split_sandbox_path(dst)
    if (src_id is None) == (dst_id is None):
        fail("exactly one of SRC and DST must be a sandbox path ID:path, e.g. "
             "`orchard sandbox cp ./data ID:/workspace/data`")
    if dst.endswith("/"):
        name = posixpath.basename(src_path.rstrip("/")) if src_id else Path(src_path).name
        dst_path = posixpath.join(dst_path, name) if dst_id else str(Path(dst_path) / name)

    async def action(orch) -> None:
        async with await orch.connect(src_id or dst_id) as sandbox:
            if dst_id is not None:
                await sandbox.upload(src_path, dst_path)
            else:
                await sandbox.download(src_path, dst_path, max_bytes=max_bytes)

    run(url, api_key, action)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    return f"{seconds // 60}m" if seconds < 7200 else f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def sandboxes_table(sandboxes: list[SandboxInfo]) -> Table:
    table = Table("ID", "STATE", "IMAGE", "OWNER", "AGE", "EXPIRES IN", "LABELS", box=None)
    now = time.time()
    for sb in sorted(sandboxes, key=lambda s: s.created_at):
        labels = ",".join(f"{k}={v}" for k, v in sb.spec.labels.items())
        table.add_row(sb.id, sb.state, sb.spec.image, sb.owner, _age(now - sb.created_at),
                      _age(sb.expires_at - now), labels)
    return table


def files_table(entries: list[FileInfo]) -> Table:
    table = Table("MODE", "SIZE", "MODIFIED", "NAME", box=None)
    for entry in sorted(entries, key=lambda e: e.name):
        kind = "d" if entry.is_dir else ("l" if entry.is_symlink else "-")
        modified = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.mtime))
        name = entry.name + ("/" if entry.is_dir else "")
        table.add_row(f"{kind}{entry.mode & 0o777:03o}", str(entry.size), modified, escape(name))
    return table


@app.command()
def ls(
    target: Annotated[Optional[str], typer.Argument(
        metavar="[ID[:PATH]]", help="Without it: the server's sandboxes. With ID: that sandbox's workdir; "
                                     "with ID:PATH: that directory.")] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List sandboxes, or the files of a directory in one."""
    if target is None:
        out.print(sandboxes_table(run(url, api_key, lambda orch: orch.list())))
        return
    sandbox_id, path = split_sandbox_path(target) if ":" in target else (target, ".")
    if sandbox_id is None:
        fail(f"{target!r} is not ID or ID:PATH")

    async def action(orch) -> list[FileInfo]:
        async with await orch.connect(sandbox_id) as sandbox:
            return await sandbox.list_dir(path)

    out.print(files_table(run(url, api_key, action)))


@app.command()
def rm(
    sandbox_ids: Annotated[list[str], typer.Argument(metavar="ID", help="Sandboxes to delete.")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Delete sandboxes: their processes and files are gone. Tries every ID; exits 1 if any failed."""

    async def action(orch) -> list[str]:
        failures = []
        for sandbox_id in sandbox_ids:
            try:
                await orch.delete(sandbox_id)
                out.print(f"deleted {escape(sandbox_id)}")
            except OrchardError as exc:
                err.print(f"[bold red]error:[/] {escape(str(exc))}")
                failures.append(sandbox_id)
        return failures

    if run(url, api_key, action):
        raise typer.Exit(1)
