"""`orchard image import|list|rm`: task images from OCI archives, for the local backend's `oci:NAME`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from orchard.cli.sandbox import fail, out
from orchard.core.errors import OrchardError
from orchard.core.home import resolve_home

app = typer.Typer(help="Task images from OCI archives: import them, list them, remove them (docs/images.md).",
                  no_args_is_help=True, pretty_exceptions_enable=False)

HomeOption = Annotated[Optional[Path], typer.Option(
    envvar="ORCHARD_HOME", show_envvar=True, help="State directory (default ~/.orchard); images live in its images/.")]


def _store(home: Path | None):
    from orchard.sandbox.images import ImageStore

    return ImageStore(resolve_home(home) / "images")


@app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="An OCI image layout (a directory or a tar of one), an oci-archive, "
                                              "or a `docker save` / `podman save` archive.")],
    name: Annotated[Optional[str], typer.Option(
        help="Name it this (repo:tag) instead of the names the archive carries.")] = None,
    home: HomeOption = None,
) -> None:
    """Unpack the image into the store (once per digest) and name it; then run it as image 'oci:NAME'."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from orchard.sandbox.backends.local.bwrap import image_ids

    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), transient=True,
                  console=out) as progress:
        task = progress.add_task("reading the archive", total=None)

        def report(layer: int, layers: int, done: int) -> None:
            progress.update(task, description=f"layer {layer}/{layers}", completed=done)

        try:
            record, names = _store(home).import_archive(file, name=name, ids=image_ids(), progress=report)
        except OrchardError as e:
            fail(str(e))
    seconds = time.perf_counter() - started
    shown = ", ".join(names) or "(no name: the archive carries none; use --name, or the digest)"
    out.print(f"imported {escape(record.digest)} ({len(record.layers)} layers, {record.size_bytes / 1e6:.1f} MB "
              f"in {seconds:.1f} s) as {escape(shown)}")
    for skipped in record.skipped:
        out.print(f"[yellow]skipped:[/] {escape(skipped)}")
    out.print(f"run it with image='oci:{escape(names[0] if names else record.digest)}'")


@app.command("list")
def list_command(home: HomeOption = None) -> None:
    """Every imported image: its names, digest, layers and size."""
    store = _store(home)
    names: dict[str, list[str]] = {}
    for name, digest in sorted(store.index().names.items()):
        names.setdefault(digest, []).append(name)
    table = Table(title="images", show_lines=False)
    for column in ("names", "digest", "layers", "size", "owned as"):
        table.add_column(column)
    for record in store.records():
        owner = f"host {record.ids.base}+id" if record.ids else "the importer"
        table.add_row(escape(", ".join(names.get(record.digest, [])) or "-"), record.digest[:19],
                      str(len(record.layers)), f"{record.size_bytes / 1e6:.1f} MB", owner)
    out.print(table)


@app.command("rm")
def rm_command(
    image: Annotated[str, typer.Argument(help="A name (removes that name; the image goes with its last name) or a "
                                              "digest (removes the image and all its names).")],
    home: HomeOption = None,
) -> None:
    """Remove an imported image or one of its names. Delete the sandboxes running it first."""
    try:
        removed = _store(home).remove(image)
    except OrchardError as e:
        fail(str(e))
    out.print("removed " + escape(", ".join(removed)))
