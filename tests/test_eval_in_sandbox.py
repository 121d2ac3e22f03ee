"""`orchard eval` for a harness that runs inside the sandbox (it names a harness bundle): the bundle mounted,
the run's gateway reachable at the fixed loopback URL and nothing else, a key good for the rollout's own
routes only. All real: the tiny test bundle (Debian's Python 3.13) built once, embedded local sandboxes, the
run's own gateway in front of the scripted model server. The probe harness is a plug-in (a real dist-info):
it runs a script with the bundle's own Python inside the sandbox, the way a CLI harness would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.core.errors import InvalidRequest
from orchard.core.jsonl import read_jsonl
from orchard.core.task import ScriptGrader, Task, TaskEnvironment
from orchard.core.task_suite import TaskSuite
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.sandbox.client import AsyncOrchard
from tests.harness_bundle_rig import TINY
from tests.harness_rig import SCRIPTED, scripted_config
from tests.in_sandbox_harness_rig import k8s_run
from tests.plugin_site import site_on_path, write_distribution
from tests.running_server import live_sandbox_ids
from tests.test_harness_bundles import bundle_home  # noqa: F401  (a fixture: the tiny bundle, built once)

PROBE = "in-sandbox-probe"
# What the probe runs inside, with the bundle's Python: one chat call through the gateway it was given,
# the same call under another rollout's URL with its key, and a connection to the outside.
INSIDE = r'''
import json, os, socket, sys, urllib.error, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
def chat(url):
    body = json.dumps({"model": os.environ["MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(url + "/chat/completions", body, {"Authorization": "Bearer " + key,
                                                                       "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as e:
        return e.code, None
try:
    socket.create_connection(("1.1.1.1", 80), timeout=2).close()
    egress = "open"
except OSError:
    egress = "blocked"
other = base.replace("/r/", "/r/other-rollout-", 1)
print(json.dumps({"python": sys.version.split()[0], "base": base, "answer": chat(base), "other": chat(other)[0],
                  "egress": egress}))
'''
SOURCE = f'''
from orchard.core.harness_bundle import get_bundle_spec
from orchard.core.trajectory import Agent, Step, Trajectory

INSIDE = {INSIDE!r}

class Probe:
    name, version, bundle = {PROBE!r}, "0.1", {TINY!r}

    async def run(self, task, sandbox, model):
        python = get_bundle_spec(self.bundle).mount_point() + "/venv/bin/python"
        env = {{"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": model.api_key.get_secret_value(),
               "MODEL": model.model}}
        result = await sandbox.exec([python, "-c", INSIDE], env=env, timeout=60)
        await sandbox.write_file("probe.json", result.stdout)
        return Trajectory(agent=Agent(name=self.name, version=self.version), task_id=task.id,
                          exit_status="submitted", steps=[Step(step_id=1, source="agent",
                                                               message=result.stdout + result.stderr)],
                          extra={{"native_logs": ["/workspace/probe.json", "/nowhere/gone.log"]}})

class Unknown(Probe):
    name, bundle = "in-sandbox-unknown", "no-such-bundle"

class Silent(Probe):
    name = "in-sandbox-silent"

    async def run(self, task, sandbox, model):
        await sandbox.write_file("probe.json", '{{"egress": "blocked"}}')
        return Trajectory(agent=Agent(name=self.name, version=self.version), exit_status="submitted",
                          notes="exit code 0, nothing on stderr")

class FromGateway(Probe):
    name, steps_from_gateway = "in-sandbox-from-gateway", True

    async def run(self, task, sandbox, model):
        trajectory = await super().run(task, sandbox, model)
        trajectory.steps = []
        return trajectory
'''


@pytest.fixture
def probe(tmp_path, monkeypatch, bundle_home):
    site_dir = next(site_on_path(tmp_path, monkeypatch, ("orchard_probe",)))
    write_distribution(site_dir, "orchard-probe", "0.1", "orchard.harnesses",
                       {PROBE: "orchard_probe:Probe", "in-sandbox-unknown": "orchard_probe:Unknown",
                        "in-sandbox-silent": "orchard_probe:Silent",
                        "in-sandbox-from-gateway": "orchard_probe:FromGateway"},
                       {"orchard_probe.py": SOURCE})
    monkeypatch.setenv("ORCHARD_HOME", str(bundle_home))
    return bundle_home


def _suite(image: str = "host") -> TaskSuite:
    task = Task(id="probe", instruction="Say hi.", environment=TaskEnvironment(image=image, workdir="/workspace"),
                grader=ScriptGrader(script="grep -q '\"egress\": \"blocked\"' probe.json"))
    return TaskSuite(name="probe-suite", tasks=[task])


async def test_an_in_sandbox_harness_gets_its_bundle_and_only_its_rollouts_gateway(probe, tmp_path, scripted):
    scripted.load([{"content": "hello from the model"}], loop=True)
    out = tmp_path / "run"
    results = await run_eval(harness=PROBE, model=SCRIPTED, suite=_suite(), out_dir=out,
                             gateway_config=scripted_config(scripted), backend="local")
    _check_probe_run(out, results)
    assert not await live_sandbox_ids(probe)


def _check_probe_run(out: Path, results) -> None:
    (row,) = results.tasks
    (trajectory,) = read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False)
    seen = json.loads(trajectory.steps[0].message.splitlines()[0])
    assert seen["python"].startswith("3.13.")  # the bundle's interpreter, not the host's 3.11
    assert seen["base"] == f"http://127.0.0.1:4000/r/{trajectory.rollout_key.replace(':', '%3A')}/v1"
    assert seen["answer"] == [200, "hello from the model"]
    assert seen["other"] in (401, 403)  # the rollout's key opens its own routes only
    assert seen["egress"] == "blocked"  # the gateway is all the network there is
    assert (row.status, row.n_llm_calls) == ("resolved", 1)  # recorded under the trial's own rollout
    # the harness's native logs, copied out before its sandbox went; what could not be had is named
    key = trajectory.rollout_key.replace(":", "%3A")
    assert trajectory.extra["native_logs"] == {"/workspace/probe.json": f"native/{key}/probe.json"}
    assert json.loads((out / "native" / key / "probe.json").read_text()) == seen
    assert trajectory.extra["native_logs_missing"][0].startswith("/nowhere/gone.log: ")


async def test_steps_from_the_gateway_and_a_harness_that_never_called_the_model(probe, tmp_path, scripted):
    """`steps_from_gateway`: the Trial rebuilds the steps from the rollout's gateway records (the `cli`
    harness's way); a program that never reached the model is an error, not a failed attempt."""
    scripted.load([{"content": "hello from the model"}], loop=True)
    out = tmp_path / "rebuilt"
    await run_eval(harness="in-sandbox-from-gateway", model=SCRIPTED, suite=_suite(), out_dir=out,
                   gateway_config=scripted_config(scripted), backend="local")
    (trajectory,) = read_jsonl(out / TRAJECTORIES_FILE, allow_interrupted_tail=False)
    assert [(step.source, step.message) for step in trajectory.steps] == [("user", "hi"),
                                                                          ("agent", "hello from the model")]
    assert not trajectory.partial and trajectory.steps[1].llm_call_ids == [trajectory.llm_calls[0].id]
    results = await run_eval(harness="in-sandbox-silent", model=SCRIPTED, suite=_suite(), out_dir=tmp_path / "s",
                             gateway_config=scripted_config(scripted), backend="local")
    (row,) = results.tasks
    assert (row.status, row.error) == ("error", "the harness never called the model (exit code 0, nothing on stderr)")


@pytest.mark.k8s
async def test_on_kubernetes_the_pod_reaches_the_runs_gateway_at_the_node_address(probe, tmp_path, scripted,
                                                                                  monkeypatch):
    """The same run on the dev cluster: the bundle copied from its injector image, the run's gateway listening
    on the node's address (ORCHARD_GATEWAY_HOST, as `cluster.sh env` exports it) and allowed to that Pod
    alone; without that address the run is refused before anything is written."""
    from tests.k8s_cluster import NODE_IP

    with k8s_run(probe, TINY) as config:
        suite = _suite("localhost/orchard-base:local")
        scripted.load([{"content": "hello from the model"}], loop=True)
        monkeypatch.delenv("ORCHARD_GATEWAY_HOST", raising=False)
        with pytest.raises(InvalidRequest, match="set ORCHARD_GATEWAY_HOST to an address of this machine"):
            await run_eval(harness=PROBE, model=SCRIPTED, suite=suite, out_dir=tmp_path / "refused",
                           gateway_config=scripted_config(scripted), backend=config)
        assert not (tmp_path / "refused").exists()
        monkeypatch.setenv("ORCHARD_GATEWAY_HOST", NODE_IP)
        out = tmp_path / "run"
        results = await run_eval(harness=PROBE, model=SCRIPTED, suite=suite, out_dir=out,
                                 gateway_config=scripted_config(scripted), backend=config)
        _check_probe_run(out, results)


async def test_an_in_sandbox_harness_is_refused_where_the_run_cannot_give_it_the_gateway(probe, tmp_path, scripted):
    async with AsyncOrchard(home=probe) as orchard:
        with pytest.raises(InvalidRequest, match=r"in-sandbox harness \(or a task's simulated user\) needs sandboxes "
                                                 "that reach this run's"):
            await run_eval(harness=PROBE, model=SCRIPTED, suite=_suite(), out_dir=tmp_path / "a",
                           gateway_config=scripted_config(scripted), orchard_client=orchard)
    with pytest.raises(InvalidRequest, match="unknown harness bundle 'no-such-bundle'"):
        await run_eval(harness="in-sandbox-unknown", model=SCRIPTED, suite=_suite(), out_dir=tmp_path / "b",
                       gateway_config=scripted_config(scripted), backend="local")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before anything is written
