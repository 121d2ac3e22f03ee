"""The table `orchard harness list` and `orchard model list` print: one row per plugin found through an
entry-point group, built in or added by a package."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rich.markup import escape
from rich.table import Table

from orchard.cli.sandbox import out


def print_plugins(infos: Sequence[Any], *, title: str, kind: str, group: str, guide: str, detail: str,
                  detail_of: Callable[[Any], str]) -> None:
    """`infos` (each with name, source, distribution, distribution_version, target and problem) as a table
    titled `title`, with the column `detail` filled by `detail_of` (rich markup, already escaped); with none,
    how a package registers one (`group`, see `guide`)."""
    table = Table(title=title)
    for column in ("name", detail, "source", "package", "entry point"):
        table.add_column(column, overflow="fold")
    for info in infos:
        package = f"{info.distribution or '-'} {info.distribution_version or ''}".strip()
        table.add_row(escape(info.name), detail_of(info), info.source, escape(package), escape(info.target or "-"))
    out.print(table)
    if not infos:
        out.print(f"no {kind} is registered: a package adds one with an entry point in the {group!r} group "
                  f"(see {guide})")
