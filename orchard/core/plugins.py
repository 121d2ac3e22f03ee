"""One registry for every kind of plug-in: harnesses, backends, models, harness bundles (and the suite formats
and services to come), built in or third party, found the same way.

A kind is an entry-point group (`orchard.harnesses`, `orchard.backends`, ...). A plug-in is named either by
its entry point's name, or — for a user's own class, not packaged — by an import path `module:attr`
(`my_agents.harness:MyHarness`, as mini-swe-agent and Harbor take them), imported from `sys.path` (a module
of one's own: on PYTHONPATH).
The rules are the same for every kind:

- listing reads entry-point metadata only: nothing is imported (a backend's client library, torch);
- an unknown name is an `InvalidRequest` naming the registered ones and how to add one;
- one name registered by two packages is a `PluginError` naming both (never "the last one wins");
- a plug-in that fails to import, or is not what its kind needs, is a `PluginError` naming it, its
  package and why.

Each kind's module keeps what is its own: what a plug-in must be (a Harness, a Policy...), how it is made,
its listing's detail column."""

from __future__ import annotations

import re
import sys
import threading
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchard.core.errors import InvalidRequest, PluginError

BUILTIN_DISTRIBUTION = "orchard"
# `package.module:attr.attr`: a dotted module, a colon, a dotted attribute (Python names only)
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class PluginInfo(BaseModel):
    """One row of `orchard <kind> list`."""

    kind: str
    name: str
    source: Literal["builtin", "plugin", "path", "live"]
    distribution: str | None = Field(default=None, description="the installed package that registers it")
    distribution_version: str | None = Field(default=None, description="that package's version")
    target: str | None = Field(default=None, description="the entry point's `module:attr`")
    detail: str | None = Field(default=None, description="what the kind shows of a loaded plug-in (version, "
                                                          "description, capabilities)")
    problem: str | None = Field(default=None, description="why the plug-in could not be loaded")


def is_import_path(name: str) -> bool:
    """`module:attr`: a user's own class named by where it is, not by a registered name."""
    return bool(_IMPORT_PATH.match(name))


class Registry:
    """The plug-ins of one entry-point `group`, called `kind` in messages (`harness`, `backend`...); `guide`:
    the doc that says how to write one. With `cached`, the scan is kept per `sys.path` (for a kind asked on
    every call, as the gateway asks for models; `refresh()` scans again); else every lookup scans."""

    def __init__(self, kind: str, group: str, guide: str, *, cached: bool = False) -> None:
        self.kind, self.group, self.guide, self.cached = kind, group, guide, cached
        self._lock = threading.Lock()
        self._scanned: tuple[tuple[str, ...], tuple[EntryPoint, ...]] | None = None
        self._by_path: dict[str, EntryPoint] = {}  # plug-ins named by import path, under their own name

    def entries(self) -> tuple[EntryPoint, ...]:
        if not self.cached:
            return tuple(entry_points(group=self.group))
        key = tuple(sys.path)
        with self._lock:
            if self._scanned is None or self._scanned[0] != key:
                self._scanned = (key, tuple(entry_points(group=self.group)))
            return self._scanned[1]

    def refresh(self) -> None:
        """Scan again (a package installed into this process's paths since the last scan)."""
        with self._lock:
            self._scanned = None

    def names(self) -> list[str]:
        """Every registered name; nothing is imported."""
        return sorted({entry.name for entry in self.entries()})

    def entry(self, name: str) -> EntryPoint:
        """The entry point of `name`, or one made for an import path `module:attr`."""
        if is_import_path(name):
            return EntryPoint(name=name.rpartition(":")[2].rpartition(".")[2], value=name, group=self.group)
        if name in self._by_path:
            return self._by_path[name]
        matches = [entry for entry in self.entries() if entry.name == name]
        if not matches:
            raise InvalidRequest(
                f"unknown {self.kind} {name!r}; available: {', '.join(self.names()) or 'none'} (a package adds one "
                f"with an entry point in the {self.group!r} group, or name your own class as module:Class; see "
                f"{self.guide})")
        distinct = {(entry.value, distribution(entry)) for entry in matches}
        if len(distinct) > 1:
            owners = ", ".join(sorted(f"{dist} ({value})" for value, dist in distinct))
            raise PluginError(f"{self.kind} {name!r} is registered by more than one package: {owners}; uninstall "
                              "all but one")
        return matches[0]

    def load(self, name: str, *, hint: str = "") -> tuple[Any, EntryPoint]:
        """What `name`'s entry point (or import path) points at, imported, and the entry point."""
        entry = self.entry(name)
        try:
            target = entry.load()
        except Exception as exc:  # a plug-in's import can fail in any way: say which and why
            raise PluginError(f"{self.where(entry)} failed to import: {type(exc).__name__}: {exc}"
                              + (f"; {hint}" if hint else "")) from exc
        return target, entry

    def remember(self, entry: EntryPoint, own_name: str) -> None:
        """A plug-in loaded by import path answers to its own name in this process from now on (a config that
        records the name, e.g. a backend's, finds it again). A registered name is never shadowed."""
        if own_name in self.names():
            raise PluginError(f"{self.where(entry)} calls itself {own_name!r}, the name of a registered "
                              f"{self.kind}; give it a name of its own")
        self._by_path[own_name] = EntryPoint(name=own_name, value=entry.value, group=self.group)

    def where(self, entry: EntryPoint) -> str:
        """How messages name a plug-in: its kind, name, target and package."""
        dist = distribution(entry)
        return f"{self.kind} {entry.name!r} ({entry.value}{f', from {dist}' if dist else ''})"

    def info(self, entry: EntryPoint, *, detail: str | None = None, problem: str | None = None) -> PluginInfo:
        dist = distribution(entry)
        return PluginInfo(kind=self.kind, name=entry.name, source="builtin" if dist == BUILTIN_DISTRIBUTION else
                          "plugin", distribution=dist, distribution_version=entry.dist.version if entry.dist else None,
                          target=entry.value, detail=detail, problem=problem)


def distribution(entry: EntryPoint) -> str | None:
    return entry.dist.name if entry.dist is not None else None


def check_name(registry: Registry, entry: EntryPoint, own_name: str) -> None:
    """A registered plug-in's own `name` is the one it is registered under: trajectories and records carry
    it. A plug-in named by import path is called what it calls itself."""
    if entry.dist is None and is_import_path(entry.value):
        return
    if own_name != entry.name:
        raise PluginError(f"{registry.where(entry)} calls itself {own_name!r}; its entry point name and its `name` "
                          "must match, since records carry the name")
