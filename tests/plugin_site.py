"""A third-party plug-in as `pip install` would leave it, made by tests: its modules and a `*.dist-info`
with its entry points, in a site directory put first on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator


def write_distribution(site: Path, distribution: str, version: str, group: str, entries: dict[str, str],
                       modules: dict[str, str]) -> None:
    """`modules` (file name → source) and the distribution's metadata with `entries` in entry-point
    `group`."""
    for name, code in modules.items():
        (site / name).write_text(code)
    dist_info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entries.items())
    (dist_info / "entry_points.txt").write_text(f"[{group}]\n{lines}\n")


def site_on_path(tmp_path: Path, monkeypatch, module_prefixes: tuple[str, ...]) -> Iterator[Path]:
    """A fresh site directory on sys.path (for a fixture to yield from); the modules imported from it, named
    with one of `module_prefixes`, are forgotten afterwards."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        if name.startswith(module_prefixes):
            del sys.modules[name]
