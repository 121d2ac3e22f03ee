"""The harness registry, against real entry points: each test installs a small distribution (a module and
its `*.dist-info` with `entry_points.txt`) into a temporary directory on sys.path, which is what pip does
for an installed plugin, and `importlib.metadata` finds it there."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.core.errors import InvalidRequest, PluginError
from orchard.core.harness import (
    ENTRY_POINT_GROUP,
    Harness,
    ModelConfig,
    SamplingParams,
    get_harness,
    list_harnesses,
)
from tests.plugin_site import site_on_path, write_distribution

HARNESS_MODULE = '''
from orchard.core.trajectory import Agent, Step, Trajectory


class EchoHarness:
    """Answers with the instruction, without using the sandbox or a model."""

    version = "1.2.3"

    def __init__(self, name="echo", greeting="echo"):
        self.name = name
        self.greeting = greeting

    async def run(self, task, sandbox, model):
        return Trajectory(agent=Agent(name=self.name, version=self.version, model_name=model.model),
                          task_id=task.id,
                          steps=[Step(step_id=1, source="user", message=task.instruction),
                                 Step(step_id=2, source="agent", message=f"{self.greeting}: {task.instruction}")])


class NotAHarness:
    name = "broken"


def make_named(**options):
    return EchoHarness(**options)
'''


def install_plugin(site: Path, module: str, distribution: str, entries: dict[str, str], code: str = HARNESS_MODULE,
                   version: str = "0.9.1") -> None:
    write_distribution(site, distribution, version, ENTRY_POINT_GROUP, entries, {f"{module}.py": code})


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site directory on sys.path; the plugin modules imported from it are forgotten afterwards."""
    yield from site_on_path(tmp_path, monkeypatch, ("orchard_test_",))


def test_plugin_is_discovered_by_entry_point_and_runs(site):
    install_plugin(site, "orchard_test_echo", "orchard-echo-plugin", {"echo": "orchard_test_echo:EchoHarness"})
    info = next(i for i in list_harnesses() if i.name == "echo")
    assert (info.source, info.distribution, info.distribution_version, info.detail, info.target) == (
        "plugin", "orchard-echo-plugin", "0.9.1", None, "orchard_test_echo:EchoHarness")  # nothing imported
    loaded = next(i for i in list_harnesses(load=True) if i.name == "echo")
    assert loaded.detail == get_harness("echo").version and loaded.problem is None

    harness = get_harness("echo", greeting="hi")
    assert isinstance(harness, Harness) and harness.version == "1.2.3"


async def test_loaded_plugin_harness_produces_a_trajectory(site):
    from orchard.core.task import Task

    install_plugin(site, "orchard_test_run", "orchard-run-plugin", {"echo": "orchard_test_run:EchoHarness"})
    harness = get_harness("echo")
    # The echo harness touches neither sandbox nor model endpoint, so none is started for it.
    trajectory = await harness.run(Task(id="t1", instruction="say hi"), None, ModelConfig(model="m"))
    assert trajectory.agent.name == "echo" and trajectory.task_id == "t1"
    assert trajectory.steps[-1].message == "echo: say hi"


def test_unknown_name_lists_the_available_harnesses(site):
    install_plugin(site, "orchard_test_two", "orchard-two", {"alpha": "orchard_test_two:make_named",
                                                            "beta": "orchard_test_two:make_named"})
    with pytest.raises(InvalidRequest, match=r"unknown harness 'gamma'; available: .*alpha, beta"):
        get_harness("gamma")


def test_builtin_harnesses_are_those_of_the_orchard_distribution(site):
    """A distribution named `orchard` stands in for Orchard's own pyproject entry points (it shadows the
    real `orchard` metadata only on this temporary sys.path entry)."""
    install_plugin(site, "orchard_test_builtin", "orchard", {"echo": "orchard_test_builtin:EchoHarness"},
                   version="0.1.0")
    info = next(i for i in list_harnesses() if i.name == "echo")
    assert (info.source, info.distribution) == ("builtin", "orchard")


def test_factory_options_and_bad_plugins_give_clear_errors(site):
    install_plugin(site, "orchard_test_bad", "orchard-bad", {
        "named": "orchard_test_bad:make_named",
        "broken": "orchard_test_bad:NotAHarness",
        "liar": "orchard_test_bad:EchoHarness",
        "ghost": "orchard_test_bad_missing_module:Harness",
    })
    assert get_harness("named", name="named").name == "named"
    with pytest.raises(InvalidRequest, match=r"harness 'liar' .* does not take options \['colour'\]"):
        get_harness("liar", colour="red")
    with pytest.raises(PluginError, match=r"harness 'broken' .*from orchard-bad\) is not a Harness"):
        get_harness("broken")
    with pytest.raises(PluginError, match="calls itself 'echo'"):
        get_harness("liar")
    with pytest.raises(PluginError, match=r"harness 'ghost' .* failed to import: ModuleNotFoundError"):
        get_harness("ghost")


def test_same_name_from_two_distributions_is_refused(site):
    install_plugin(site, "orchard_test_dup_a", "orchard-dup-a", {"dup": "orchard_test_dup_a:make_named"})
    install_plugin(site, "orchard_test_dup_b", "orchard-dup-b", {"dup": "orchard_test_dup_b:make_named"})
    with pytest.raises(PluginError, match="registered by more than one package: .*orchard-dup-a.*orchard-dup-b"):
        get_harness("dup")


def test_model_config_keeps_the_key_secret_and_builds_request_kwargs():
    config = ModelConfig(model="qwen3-8b", base_url="http://gateway:4000/v1", api_key="sk-secret",
                         rollout_key="rk-1", sampling=SamplingParams(temperature=0.6, max_tokens=512,
                                                                     extra_body={"top_k": 20}))
    assert "sk-secret" not in repr(config) and "sk-secret" not in config.model_dump_json()
    assert config.api_key.get_secret_value() == "sk-secret"
    assert config.headers() == {"X-Orchard-Rollout-Key": "rk-1"}
    assert config.sampling.request_kwargs() == {"temperature": 0.6, "max_tokens": 512, "extra_body": {"top_k": 20}}
    assert ModelConfig(model="m").headers() == {}
