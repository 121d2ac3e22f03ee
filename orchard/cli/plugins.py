"""The one table every `orchard <kind> list` prints (harness, model, backend, harness bundles): one row per
plug-in found through its kind's registry (orchard/core/plugins.py), built in or added by a package."""

from __future__ import annotations

from typing import Sequence

from rich.markup import escape
from rich.table import Table

from orchard.cli.sandbox import out
from orchard.core.plugins import PluginInfo


def print_plugins(infos: Sequence[PluginInfo], *, title: str, kind: str, group: str, guide: str,
                  detail: str) -> None:
    """`infos` as a table titled `title`, with the column `detail` holding each plug-in's `detail` (or why it
    could not be loaded); with none, how a package registers one (`group`, see `guide`)."""
    table = Table(title=title)
    for column in ("name", detail, "source", "package", "entry point"):
        table.add_column(column, overflow="fold")
    for info in infos:
        package = f"{info.distribution or '-'} {info.distribution_version or ''}".strip()
        shown = f"[red]cannot load: {escape(info.problem)}[/]" if info.problem else escape(info.detail or "")
        table.add_row(escape(info.name), shown, info.source, escape(package), escape(info.target or "-"))
    out.print(table)
    if not infos:
        out.print(f"no {kind} is registered: a package adds one with an entry point in the {group!r} group "
                  f"(see {guide})")
