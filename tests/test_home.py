"""ORCHARD_HOME is resolved in one place (orchard/core/home.py): every part that keeps state under it names
the same directory, `~` expanded, however the home is given."""

from __future__ import annotations

from orchard.core.home import resolve_home
from orchard.policies.llama_cpp_runtime import runtime_dir
from orchard.sandbox.backends.local.backend import orchard_home
from orchard.sandbox.bundle import default_cache_dir
from orchard.sandbox.server.home import resolve_home as server_home


def test_every_part_names_the_same_home_with_tilde_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ORCHARD_HOME", "~/state")
    home = tmp_path / "state"
    assert resolve_home() == server_home() == orchard_home() == home
    assert default_cache_dir() == home / "cache"
    assert runtime_dir().parent.parent == home / "cache"
    monkeypatch.delenv("ORCHARD_HOME")
    assert resolve_home() == tmp_path / ".orchard" and default_cache_dir() == tmp_path / ".orchard" / "cache"
    assert resolve_home("~/other") == tmp_path / "other"
