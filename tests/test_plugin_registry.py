"""The one plug-in registry (orchard/core/plugins.py) across its kinds, against real entry points (a small
distribution installed into a temporary site directory, as pip leaves a plugin) and real modules named by
import path: duplicates refused by name, one error type, `module:Class` for a user's own class, and one
listing format in `orchard <kind> list`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.core.backend import ENTRY_POINT_GROUP as BACKENDS_GROUP
from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.harness import get_harness
from orchard.core.harness_bundle import get_bundle_spec
from orchard.policies import registry as models
from orchard.sandbox.backends.registry import backend_class, backend_config, create_backend
from tests.plugin_site import site_on_path, write_distribution

MODULE = '''
from orchard.core.harness_bundle import HarnessBundleSpec
from orchard.core.trajectory import Agent, Step, Trajectory
from orchard.policies.oracle import OraclePolicy
from typing import Literal

from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.local.config import LocalConfig


class MyHarness:
    name, version = "mine", "0.0.1"

    async def run(self, task, sandbox, model):
        return Trajectory(agent=Agent(name=self.name, version=self.version), task_id=task.id,
                          steps=[Step(step_id=1, source="agent", message="done")])


class MyModel(OraclePolicy):
    name = "my-model"


class MyLocalConfig(LocalConfig):
    backend: Literal["my-local"] = "my-local"


class MyLocal(LocalBackend):
    name, Config = "my-local", MyLocalConfig


SPEC = HarnessBundleSpec(name="my-bundle", python="3.13", requirements=["six==1.16.0"], entry=["python3"])
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    yield from site_on_path(tmp_path, monkeypatch, ("orchard_user_",))


def test_a_users_own_classes_are_found_by_import_path(site, tmp_path):
    (site / "orchard_user_mine.py").write_text(MODULE)
    assert get_harness("orchard_user_mine:MyHarness").name == "mine"
    assert models.get_policy("orchard_user_mine:MyModel").name == "my-model"
    assert get_bundle_spec("orchard_user_mine:SPEC").name == "my-bundle"
    # a backend by path: its config records its own name, which finds it again in this process
    config = backend_config("orchard_user_mine:MyLocal", tmp_path / "home")
    assert config.backend == "my-local" and type(create_backend(config)).__name__ == "MyLocal"
    with pytest.raises(PluginError, match=r"harness 'Nowhere' \(orchard_user_mine:Nowhere\) failed to import: "
                                          r"AttributeError"):
        get_harness("orchard_user_mine:Nowhere")


def test_a_backend_registered_twice_is_refused_not_the_last_one_kept(site):
    """The backend loader kept the last of two packages registering one name, silently."""
    for dist in ("orchard-user-a", "orchard-user-b"):
        write_distribution(site, dist, "1.0", BACKENDS_GROUP, {"twin": "orchard_user_mine:MyLocal"},
                           {"orchard_user_mine.py": MODULE})
    with pytest.raises(PluginError, match=r"backend 'twin' is registered by more than one package: "
                                          r"orchard-user-a .*orchard-user-b"):
        backend_class("twin")


def test_a_backend_that_fails_to_import_is_a_plugin_error(site):
    """It was an InvalidRequest (a user's bad input) where every other kind said PluginError."""
    write_distribution(site, "orchard-user-broken", "1.0", BACKENDS_GROUP,
                       {"broken": "orchard_user_missing:Backend", "misnamed": "orchard_user_mine:MyLocal"},
                       {"orchard_user_mine.py": MODULE})
    with pytest.raises(PluginError, match=r"backend 'broken' .* failed to import: ModuleNotFoundError.*install what "
                                          r"it needs"):
        backend_class("broken")
    with pytest.raises(PluginError, match=r"calls itself 'my-local'"):
        backend_class("misnamed")
    with pytest.raises(InvalidRequest, match=r"unknown backend 'nope'; available: .*local"):
        backend_class("nope")


def _listing(*args: str, home: Path) -> list[str]:
    env = {**os.environ, "ORCHARD_HOME": str(home), "COLUMNS": "400"}
    ran = subprocess.run([sys.executable, "-m", "orchard.cli.main", *args], capture_output=True, text=True,
                         timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert ran.returncode == 0, ran.stderr
    header = next(line for line in ran.stdout.splitlines() if "┃" in line)
    return [cell.strip() for cell in header.strip("┃ ").split("┃")]


@pytest.mark.parametrize("command, detail", [(("harness", "list"), "version"), (("model", "list"), "description"),
                                             (("backend", "list"), "capabilities and config fields"),
                                             (("harness", "bundles"), "python; requirements; built here")])
def test_every_kind_lists_in_one_format(command, detail, tmp_path):
    assert _listing(*command, home=tmp_path) == ["name", detail, "source", "package", "entry point"]
