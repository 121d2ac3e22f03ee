"""Orchard's own models as plugins (orchard/policies/registry.py), against real entry points: each test installs
a small distribution (a module and its `*.dist-info` with `entry_points.txt`) into a temporary directory on
sys.path, as pip does for an installed plugin. The plugin is the one docs/models.md shows ("Adding a model"),
taken from the page character for character, and it is called through the real gateway (litellm, the
`orchard` provider, recording) and told its task by a real Trial."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.errors import InvalidRequest, ModelError, PluginError
from orchard.core.policy import ENTRY_POINT_GROUP, Completion, Policy, RolloutHooks
from orchard.core.task import ScriptGrader, Task
from orchard.core.trajectory import Agent, Trajectory
from orchard.gateway.config import GatewayConfig
from orchard.gateway.gateway import Gateway
from orchard.policies import registry
from tests.plugin_site import site_on_path, write_distribution

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "models.md"
cli = CliRunner()


def doc_block(kind: str) -> tuple[str | None, str]:
    """(argument, code) of the block after the page's `<!-- doc-test: KIND [ARG] -->` marker."""
    match = re.search(rf"^<!-- doc-test: {re.escape(kind)}(?: (\S+))? -->\n```[a-z]*\n(.*?)^```$", DOC.read_text(),
                      re.MULTILINE | re.DOTALL)
    assert match, f"{DOC.name} has no `{kind}` block"
    return match.group(1), match.group(2)


def install(site: Path, distribution: str, modules: dict[str, str], entries: dict[str, str]) -> None:
    write_distribution(site, distribution, "0.3.0", ENTRY_POINT_GROUP, entries, modules)


def install_doc_example(site: Path) -> None:
    """The page's module and entry point, as `pip install` of that package would leave them."""
    module, code = doc_block("model-module")
    entries = tomllib.loads(doc_block("model-entry-point")[1])["project"]["entry-points"][ENTRY_POINT_GROUP]
    install(site, "orchard-echo-model", {module: code}, entries)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site directory on sys.path; its plugin modules are forgotten afterwards."""
    yield from site_on_path(tmp_path, monkeypatch, ("orchard_echo", "orchard_test_"))


def ask(gateway: Gateway, key: str, model: str, text: str) -> dict[str, Any]:
    return asyncio.run(gateway.complete(key, {"model": model, "messages": [{"role": "user", "content": text}]}))


# --- the built-in models are entries like any other --------------------------------------------------

def test_oracle_and_smollm2_are_registered_entry_points_and_listing_imports_nothing():
    code = ("import sys; from orchard.policies.registry import list_models;"
            "print(sorted((m.name, m.source, m.target) for m in list_models()));"
            "print([m for m in ('torch', 'transformers', 'litellm', 'orchard.policies.oracle',"
            " 'orchard.policies.smollm2') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed, imported = done.stdout.strip().split("\n")
    assert listed == str([("oracle", "builtin", "orchard.policies.oracle:OraclePolicy"),
                          ("smollm2", "builtin", "orchard.policies.smollm2:SmolLM2Policy")])
    assert imported == "[]"
    oracle, smollm2 = registry.get_policy("oracle"), registry.get_policy("smollm2")
    assert isinstance(oracle, Policy) and isinstance(oracle, RolloutHooks) and not oracle.blocking
    assert isinstance(smollm2, Policy) and not isinstance(smollm2, RolloutHooks) and smollm2.blocking
    assert registry.get_policy("oracle") is oracle  # created once per process


def test_an_unknown_model_lists_the_available_ones():
    with pytest.raises(InvalidRequest, match=r"unknown model orchard/nope: Orchard's own models are oracle, "
                                             r"smollm2 \(a package adds one .*'orchard\.models' group, or name your own class as module:Class\)"):
        registry.get_policy("nope")
    assert registry.policy_for_route("openai/gpt-4.1") is None


# --- a plugin's model (the page's example) ----------------------------------------------------------

def test_the_docs_example_plugin_is_listed_and_served_by_the_real_gateway(site):
    install_doc_example(site)
    info = next(m for m in registry.list_models() if m.name == "echo")
    assert (info.source, info.distribution, info.target, info.detail) == (
        "plugin", "orchard-echo-model", "orchard_echo_model:EchoModel", None)  # nothing imported
    assert "orchard_echo_model" not in sys.modules
    assert next(m for m in registry.list_models(load=True) if m.name == "echo").detail.startswith("answers")

    gateway = Gateway(GatewayConfig())  # no alias, no allow_any_model: the registry routes it
    assert "echo" in gateway.models()
    body = ask(gateway, "echo-1", "echo", "hello there")
    assert body["model"] == "echo" and body["choices"][0]["message"]["content"] == "[no task] hello there"
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["total_tokens"] == 0
    (call,) = gateway.end_rollout("echo-1").calls
    assert call.model == "echo" and call.extra["provider_model"] == "orchard/echo" and call.error is None

    listed = cli.invoke(app, ["model", "list"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0, listed.output
    assert re.search(r"echo .*answers with the last user message.* plugin .*orchard-echo-model 0\.3\.0", listed.output)
    assert re.search(r"oracle .* builtin .*orchard\.policies\.oracle:OraclePolicy", listed.output)


def test_the_docs_cli_lines_parse():
    for line in doc_block("model-cli")[1].strip().split("\n"):
        argv = shlex.split(line)
        assert argv[0] == "orchard"
        result = cli.invoke(app, [*argv[1:], "--help"])
        assert result.exit_code == 0, f"{line!r}: {result.output}"


class _AskOnce:
    """A harness that makes one model call through the gateway and keeps the answer in its notes."""

    name = "ask-once"
    version = "1"

    async def run(self, task, sandbox, model):
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{model.base_url}/chat/completions", headers={
                **model.headers(), "Authorization": f"Bearer {model.api_key.get_secret_value()}"}, json={
                "model": model.model, "messages": [{"role": "user", "content": task.instruction}]})
        response.raise_for_status()
        trajectory = Trajectory(agent=Agent(name=self.name, version=self.version), exit_status="submitted")
        trajectory.notes = response.json()["choices"][0]["message"]["content"]
        return trajectory


async def _trial(home: Path, model: str, task: Task, config: GatewayConfig) -> Trajectory:
    from orchard.core.harness import SamplingParams
    from orchard.eval.local_gateway import LocalGateway
    from orchard.eval.run_config import TrialTimeouts
    from orchard.eval.trial import Trial, TrialRig
    from orchard.sandbox.client import AsyncOrchard

    with LocalGateway(config) as gateway:
        async with AsyncOrchard(home=home) as orch:
            rig = TrialRig(harness=_AskOnce(), model=model, sampling=SamplingParams(), timeouts=TrialTimeouts(),
                           orch=orch, gateway=gateway, agent_slots=asyncio.Semaphore(1),
                           grading_slots=asyncio.Semaphore(1))
            return await Trial(rig, task, f"{task.id}:{model}:1", {}).run()


async def test_a_trial_tells_a_plugins_model_its_task_through_the_hooks(site, sandbox_home):
    """The evaluator names no model: it calls the rollout hooks of whichever policy the run's model reaches,
    by name or through an alias, and ends the rollout afterwards."""
    from orchard.eval.models import eval_gateway_config

    install_doc_example(site)
    task = Task(id="echo-probe", instruction="say hi", grader=ScriptGrader(script="true"))
    done = await _trial(sandbox_home, "echo", task, eval_gateway_config("echo"))
    assert done.notes == "[echo-probe] say hi" and done.exit_status == "submitted" and done.outcome.resolved
    aliased = GatewayConfig.model_validate({"models": {"student": {"model": "orchard/echo"}}})
    done = await _trial(sandbox_home, "student", task, aliased)
    assert done.notes == "[echo-probe] say hi"
    assert registry.get_policy("echo").tasks == {}  # end_rollout ran


async def test_a_model_that_refuses_the_task_is_a_model_error(sandbox_home):
    """The oracle's prepare_rollout refuses a task without a reference patch: the trial says so."""
    from orchard.eval.models import eval_gateway_config

    task = Task(id="no-patch", instruction="say hi", grader=ScriptGrader(script="true"))
    done = await _trial(sandbox_home, "oracle", task, eval_gateway_config("oracle"))
    assert done.exit_status == "model_error"
    assert "model 'oracle' cannot run task 'no-patch'" in done.outcome.error and "reference patch" in done.outcome.error


# --- what the registry refuses -----------------------------------------------------------------------

BROKEN = '''
from orchard.core.policy import Completion


class NoComplete:
    name = "half"
    description = "no complete"
    blocking = False


class Misnamed:
    name = "other"
    description = "calls itself other"
    blocking = False

    def complete(self, messages, tools, params, *, rollout_key, timeout_s):
        return Completion(message={"role": "assistant", "content": "x"}, finish_reason="stop")
'''


def test_broken_plugins_are_clear_errors_and_listed_with_the_reason(site):
    install(site, "orchard-test-broken", {"orchard_test_broken.py": BROKEN},
            {"half": "orchard_test_broken:NoComplete", "misnamed": "orchard_test_broken:Misnamed",
             "missing": "orchard_test_nowhere:Model"})
    with pytest.raises(PluginError, match=r"model 'half' .* is not a Policy: it needs .*complete"):
        registry.get_policy("half")
    with pytest.raises(PluginError, match=r"calls itself 'other'; its entry point name and its `name` must match"):
        registry.get_policy("misnamed")
    with pytest.raises(PluginError, match=r"model 'missing' .* failed to import: ModuleNotFoundError"):
        registry.get_policy("missing")
    problems = {m.name: m.problem for m in registry.list_models(load=True)}
    assert problems["oracle"] is None and "ModuleNotFoundError" in problems["missing"]
    # through the gateway: the plugin's error, as the gateway's typed error
    with pytest.raises(ModelError, match=r"model .orchard/missing. failed \(500\): .*failed to import"):
        ask(Gateway(GatewayConfig()), "broken-1", "missing", "hi")


def test_live_policies_are_found_beside_the_registered_ones_and_cannot_take_their_names():
    class Scripted:
        def complete(self, messages, tools, params, *, rollout_key, timeout_s):
            return Completion(message={"role": "assistant", "content": f"live {rollout_key}"}, finish_reason="stop",
                              model="trained-0", prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[])

    with pytest.raises(InvalidRequest, match=r"other than the registered models \(oracle, smollm2\)"):
        registry.serve_live("oracle", Scripted())
    assert registry.serve_live("policy-test", Scripted()) == "orchard/policy-test"
    try:
        assert "policy-test" in registry.model_names()
        served = registry.get_policy("policy-test")
        assert served.name == "policy-test" and served.blocking and not isinstance(served, RolloutHooks)
        assert next(m for m in registry.list_models() if m.name == "policy-test").source == "live"
        gateway = Gateway(GatewayConfig())
        body = ask(gateway, "live-1", "policy-test", "hi")
        assert body["model"] == "trained-0" and body["choices"][0]["message"]["content"] == "live live-1"
        assert body["prompt_token_ids"] == [1, 2] and body["choices"][0]["token_ids"] == [3]
        gateway.end_rollout("live-1")
    finally:
        registry.withdraw_live("policy-test")
    assert "policy-test" not in registry.model_names()
