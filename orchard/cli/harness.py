"""`orchard harness list`: every harness registered (built in or by a plugin package), with the version each
records in its trajectories; `orchard harness build` / `bundles` / `lock`: harness bundles, built, listed and
locked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchard.cli.plugins import print_plugins
from orchard.cli.sandbox import err, fail, out

app = typer.Typer(help="Harnesses: the agent loops `orchard eval --harness NAME` can run.", no_args_is_help=True,
                  pretty_exceptions_enable=False)


@app.command("list")
def list_command() -> None:
    """Every harness found through the `orchard.harnesses` entry points: built in, or added by a plugin."""
    from orchard.core.harness import ENTRY_POINT_GROUP, list_harnesses

    print_plugins(list_harnesses(load=True), title="harnesses", kind="harness", group=ENTRY_POINT_GROUP,
                  guide="docs/harness-adapters.md", detail="version")


CacheOption = Annotated[Optional[Path], typer.Option(
    "--cache-dir", file_okay=False,
    help="Where bundles are built and found (default $ORCHARD_HOME/cache, what `orchard serve` uses).")]


@app.command("build")
def build_command(
    names: Annotated[Optional[list[str]], typer.Argument(help="Bundles to build (`orchard harness bundles`).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Build every registered bundle.")] = False,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Build again even when built.")] = False,
    cache_dir: CacheOption = None,
) -> None:
    """Build harness bundles: each harness's own Python and pinned packages, from Debian and PyPI, mounted
    read-only at /.orchard/harness/NAME into sandboxes that ask for it (docs/harness-bundles.md)."""
    from orchard.core.errors import OrchardError
    from orchard.core.harness_bundle import bundle_spec_names, get_bundle_spec
    from orchard.sandbox.bundle import default_cache_dir
    from orchard.sandbox.harness_bundles.build import ensure_bundle

    if all_ == bool(names):
        fail("name the bundles to build, or pass --all (not both); `orchard harness bundles` lists them", code=2)
    cache = cache_dir or default_cache_dir()
    failed = 0
    for name in bundle_spec_names() if all_ else names or []:
        started = time.monotonic()
        try:
            spec = get_bundle_spec(name)
            with err.status(f"{escape(name)}: starting") as status:
                built = ensure_bundle(spec, cache, rebuild=rebuild,
                                      progress=lambda step: status.update(f"{escape(name)}: {escape(step)}"))
        except OrchardError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}")
            failed += 1
            continue
        m = built.manifest
        out.print(f"[green]✓[/] {escape(name)}: Python {m.python_version}, {len(m.installed)} distributions, "
                  f"{m.size_bytes / 1e6:.0f} MB ({time.monotonic() - started:.1f} s) → {escape(str(built.path))}")
    if failed:
        raise typer.Exit(1)


@app.command("lock")
def lock_command(
    name: Annotated[str, typer.Argument(help="The bundle whose lock to make (`orchard harness bundles`).")],
    requirements: Annotated[list[str], typer.Argument(help="Its top-level pins, `name==version`.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", dir_okay=False,
                                                   help="Write the lock to this file (default: print it).")] = None,
    cache_dir: CacheOption = None,
) -> None:
    """Make a bundle's lock: every distribution its top-level pins resolve to (in a throw-away build of the
    bundle), one `name==version` a line, for a spec with `locked=True` (docs/harness-bundles.md, "Locks")."""
    from orchard.core.errors import OrchardError
    from orchard.core.harness_bundle import get_bundle_spec
    from orchard.sandbox.bundle import default_cache_dir
    from orchard.sandbox.harness_bundles.lock import resolve_lock

    try:
        spec = get_bundle_spec(name)
        with err.status(f"{escape(name)}: resolving") as status:
            pins = resolve_lock(spec, requirements, cache_dir or default_cache_dir(),
                                progress=lambda step: status.update(f"{escape(name)}: {escape(step)}"))
    except (OrchardError, ValueError) as exc:
        fail(str(exc))
    text = f"# orchard harness lock {name} {' '.join(requirements)}\n" + "".join(f"{pin}\n" for pin in pins)
    if output is None:
        print(text, end="")
        return
    try:
        partial = output.with_name(f".{output.name}.partial")
        partial.write_text(text)
        partial.replace(output)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        fail(f"could not write the lock to {output}: {exc}")
    err.print(f"[green]✓[/] {escape(name)}: {len(pins)} pins → {escape(str(output))}")


@app.command("bundles")
def bundles_command(cache_dir: CacheOption = None) -> None:
    """Every registered harness bundle (built in or from a plugin) and whether it is built here."""
    from orchard.core.errors import OrchardError
    from orchard.core.harness_bundle import BUNDLE_ENTRY_POINT_GROUP, BUNDLES, get_bundle_spec
    from orchard.sandbox.bundle import default_cache_dir
    from orchard.sandbox.harness_bundles.store import read_built

    cache = cache_dir or default_cache_dir()
    infos = []
    for entry in BUNDLES.entries():
        try:
            spec = get_bundle_spec(entry.name)
        except OrchardError as exc:
            infos.append(BUNDLES.info(entry, problem=str(exc)))
            continue
        built = read_built(cache, spec)
        state = (f"built ({built.manifest.size_bytes / 1e6:.0f} MB)" if built
                 else f"not built: orchard harness build {entry.name}")
        detail = f"Python {spec.python}; {' '.join(spec.requirements + spec.debian_packages)}; {state}"
        infos.append(BUNDLES.info(entry, detail=detail))
    print_plugins(sorted(infos, key=lambda info: info.name), title="harness bundles", kind="harness bundle",
                  group=BUNDLE_ENTRY_POINT_GROUP, guide="docs/harness-bundles.md",
                  detail="python; requirements; built here")
