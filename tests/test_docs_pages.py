"""The examples of the reference pages, each checked as its marker says (kinds as in tests/doc_blocks.py;
tests/test_docs_examples.py registers which page is checked here):

- agent-protocol.md `agent-start`: the agent, copied as `orchard_agent`, starts as shown and prints READY;
- BENCHMARKS.md, k8s-dev-cluster.md, kubernetes.md, gateway.md `shell`: shape only, nothing run (a cluster,
  a deployment or a benchmark takes minutes): scripts, subcommands, make targets, modules and options exist,
  and the objects `kubectl` names are the ones deploy/k8s/ defines;
- architecture.md, k8s-dev-cluster.md `diagram`: every name in the picture exists (in the repository, or in
  the cluster scripts that make the directories drawn); the layers picture names every package of orchard/;
- gateway.md: the in-process `python` example runs against the scripted model server, the `yaml` config
  loads as a GatewayConfig file showing every setting, the budget refusal (`output`) is what the real HTTP
  gateway answers, the scripted server's `json` script is served by the command shown;
- harnesses.md `python`: runs as written on a real sandbox, a real gateway and the scripted model;
- local-backend.md `output`: the agent's launch command is the one a freshly built bundle gives;
- models.md `cli` (pip lines install what `make setup` installs) and `yaml` (a GatewayConfig);
- orchestrator.md `signatures`: each line is SandboxService's real signature (names, kinds, defaults,
  async or not, return annotation);
- trajectory.md `fields`: the schema tree names every field of the models it expands, and nothing else."""

from __future__ import annotations

import ast
import inspect
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pydantic
import pytest
import yaml

from tests import doc_blocks
from tests.harness_rig import swe_mini_task, task_sandbox, tool_calls
from tests.running_server import free_port

DOCS = doc_blocks.ROOT / "docs"


def page(name: str):
    return DOCS / name


def the_block(name: str, kind: str) -> tuple[str | None, str, int]:
    (block,) = doc_blocks.of_kind(page(name), kind)
    return block


# --- agent-protocol.md ---------------------------------------------------------------------------------------

def test_agent_protocol_the_agent_starts_as_shown(tmp_path):
    """`python3 -m orchard_agent --listen unix:/PATH/agent.sock` (the package copied under that name, as the
    backends do) prints `READY <address>`, and so does the TCP form of the comment with port 0; SIGTERM stops
    it and removes the socket; without a token it exits with status 2."""
    _, code, line = the_block("agent-protocol.md", "agent-start")
    words = shlex.split(code, comments=True)
    assert words[:4] == ["python3", "-m", "orchard_agent", "--listen"], f"agent-protocol.md:{line}"
    shutil.copytree(doc_blocks.ROOT / "orchard" / "sandbox" / "agent", tmp_path / "orchard_agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    tcp = re.search(r"tcp:[\d.]+:\d+", code.split("#", 1)[1]).group(0)
    environ = {**os.environ, "ORCHARD_AGENT_TOKEN": "doc-token"}
    for listen in (words[4].replace("/PATH", str(tmp_path)), tcp.rsplit(":", 1)[0] + ":0"):
        agent = subprocess.Popen([sys.executable, *words[1:4], listen], cwd=tmp_path, env=environ, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ready = agent.stdout.readline()
            if listen.startswith("unix:"):
                assert ready == f"READY {listen}\n", agent.stderr.read() if not ready else ready
            else:
                match = re.fullmatch(r"READY tcp:0\.0\.0\.0:(\d+)\n", ready)
                assert match and int(match.group(1)) > 0, ready
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=30) is not None
        finally:
            agent.kill()
            agent.wait()
        if listen.startswith("unix:"):
            assert not os.path.exists(listen.removeprefix("unix:")), "the socket file outlived the agent"
    tokenless = {k: v for k, v in environ.items() if not k.startswith("ORCHARD_AGENT_TOKEN")}
    ran = subprocess.run([sys.executable, *words[1:4], f"unix:{tmp_path}/b.sock"], cwd=tmp_path, env=tokenless,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran


# --- shell lines: BENCHMARKS.md, k8s-dev-cluster.md, kubernetes.md ---------------------------------------------

def test_benchmarks_reproduce_commands_exist():
    doc = page("BENCHMARKS.md")
    doc_blocks.check_shell_lines(doc)
    from bench.run import MEASUREMENTS, QUICK_JSON

    _, code, line = the_block("BENCHMARKS.md", "shell")
    for name in re.findall(r"--only (\S+)", code):
        assert name in MEASUREMENTS, f"BENCHMARKS.md:{line}: no measurement {name!r}"
    if "--quick" in code:
        assert str(QUICK_JSON.relative_to(doc_blocks.ROOT)) in code, \
            f"BENCHMARKS.md:{line}: --quick writes {QUICK_JSON}"


def test_benchmarks_page_is_rendered_with_its_marker():
    """BENCHMARKS.md is generated (`make bench`): its marker comes from the template, so it survives a run."""
    from bench.markdown import _HEADER

    assert "<!-- doc-test: shell -->" in _HEADER


def test_dev_cluster_commands_exist():
    doc_blocks.check_shell_lines(page("k8s-dev-cluster.md"))


def test_kubernetes_commands_exist_and_name_what_deploy_k8s_defines():
    doc = page("kubernetes.md")
    doc_blocks.check_shell_lines(doc)
    objects = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
               for path in (doc_blocks.ROOT / "deploy" / "k8s").glob("*.yaml")
               for d in yaml.safe_load_all(path.read_text()) if d and "kind" in d}
    namespaces = {name for kind, _, name in objects if kind == "Namespace"}
    deployment_text = (doc_blocks.ROOT / "deploy" / "k8s" / "deployment.yaml").read_text()
    for _, code, line in doc_blocks.of_kind(doc, "shell"):
        for text in code.splitlines():
            words = shlex.split(text, comments=True)
            if words[:1] != ["kubectl"]:
                continue
            namespace = words[words.index("-n") + 1] if "-n" in words else None
            assert namespace is None or namespace in namespaces, f"kubernetes.md:{line}: {text!r}"
            if "-k" in words:
                assert (doc_blocks.ROOT / words[words.index("-k") + 1] / "kustomization.yaml").is_file(), text
            for word in words:
                if word.startswith("deployment/"):
                    assert ("Deployment", namespace, word.split("/", 1)[1]) in objects, \
                        f"kubernetes.md:{line}: {text!r}"
            if words[3:6] == ["create", "secret", "generic"]:
                assert re.search(rf"secretKeyRef: {{name: {re.escape(words[6])}\b", deployment_text), \
                    f"kubernetes.md:{line}: deploy/k8s/deployment.yaml reads no Secret {words[6]}"


# --- diagrams: architecture.md, k8s-dev-cluster.md --------------------------------------------------------------

def test_architecture_diagram_names_real_packages_and_every_package():
    doc = page("architecture.md")
    doc_blocks.check_diagram_blocks(doc)
    (_, code, line), = doc_blocks.of_kind(doc, "diagram")
    packages = {f"orchard/{p.name}" for p in (doc_blocks.ROOT / "orchard").iterdir() if (p / "__init__.py").is_file()}
    drawn = {name.rstrip("/") for name in doc_blocks.diagram_names(code)}
    assert packages <= drawn, f"architecture.md:{line}: the picture leaves out {sorted(packages - drawn)}"


def test_dev_cluster_work_dir_picture_matches_the_scripts():
    doc_blocks.check_diagram_blocks(page("k8s-dev-cluster.md"))


# --- gateway.md -----------------------------------------------------------------------------------------------

async def test_gateway_in_process_example_runs(scripted):
    """The example as written, its route pointed at the scripted server instead of a vLLM one."""
    scripted.load([{"content": "hello from the policy"}])
    _, code, line = the_block("gateway.md", "python")
    assert code.count("http://vllm:8000/v1") == 1
    namespace = {"messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}
    await doc_blocks.run_python(code.replace("http://vllm:8000/v1", f"{scripted.url}/v1"), f"gateway.md:{line}",
                                namespace)
    assert namespace["body"]["choices"][0]["message"]["content"] == "hello from the policy"
    records = namespace["records"]
    assert records.budget.max_calls == 100 and records.usage.calls == 1
    (call,) = records.calls
    assert call.prompt_token_ids and call.completion_token_ids and call.logprobs  # the route's params at work
    assert call.request_params["tools"] == namespace["tools"]


def test_gateway_config_file_loads_and_shows_every_setting(tmp_path):
    from orchard.gateway.config import GatewayConfig, ModelRoute

    doc = page("gateway.md")
    (config,) = doc_blocks.check_data_blocks(doc, "yaml")
    _, code, _ = the_block("gateway.md", "yaml")
    (tmp_path / "gateway.yaml").write_text(code)
    assert GatewayConfig.load(tmp_path / "gateway.yaml") == config  # `serve(..., config=PATH)` reads it so
    assert set(yaml.safe_load(code)) == set(GatewayConfig.model_fields), "the example shows every setting"
    assert all(re.search(rf"\b{field}:", code) for field in ModelRoute.model_fields), "and every route field"


def test_gateway_budget_refusal_is_what_the_gateway_answers(scripted, gateway):
    scripted.load([{"content": "ok"}], loop=True)
    _, code, line = the_block("gateway.md", "output")
    auth = {"Authorization": f"Bearer {gateway.api_key}"}
    started = httpx.post(f"{gateway.url}/v1/rollouts/k", json={"max_calls": 2}, headers=auth, timeout=30)
    assert started.status_code == 200, started.text
    calls = [httpx.post(f"{gateway.url}/r/k/v1/chat/completions", headers=auth, timeout=30,
                        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
             for _ in range(3)]
    assert [c.status_code for c in calls] == [200, 200, 429], [c.text for c in calls]
    assert calls[2].json() == json.loads(code), f"gateway.md:{line} differs from what the gateway answers"
    httpx.delete(f"{gateway.url}/v1/rollouts/k", headers=auth, timeout=30)


def test_scripted_server_serves_the_script_shown_with_the_command_shown(tmp_path):
    doc = page("gateway.md")
    doc_blocks.check_shell_lines(doc)  # the module takes every option shown, the optional ones too
    (script,) = doc_blocks.check_data_blocks(doc, "json")
    assert len(script.responses) == 2
    _, script_code, _ = the_block("gateway.md", "json")
    _, command, line = the_block("gateway.md", "shell")
    (tmp_path / "replies.json").write_text(script_code)
    port = free_port()
    argv = [word for word in shlex.split(re.sub(r"\[[^]]*\]", "", command)) if word]
    assert argv[:3] == ["python", "-m", "orchard.testing.scripted_model"] and "replies.json" in argv, argv
    argv = [sys.executable, *argv[1:]]
    argv[argv.index("--port") + 1] = str(port)
    server = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, f"gateway.md:{line}: the server did not start"
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        request = {"model": "scripted", "messages": [{"role": "user", "content": "list the files"}]}
        first, second, third = (httpx.post(url, json=request, timeout=30) for _ in range(3))
        (call,) = first.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"cmd": "ls"}
        assert second.json()["choices"][0]["message"]["content"] == "Done: the files are a.py and b.py."
        assert third.status_code == 400 and third.json()["error"] == "script_exhausted"  # as the page says
    finally:
        server.terminate()
        server.wait(timeout=30)


# --- harnesses.md ---------------------------------------------------------------------------------------------

@pytest.fixture
def open_gateway(scripted):
    """The real gateway over HTTP without an API key (the example's ModelConfig sends none), alias `policy`
    routed to the scripted server."""
    from orchard.gateway.app import create_app
    from orchard.gateway.config import GatewayConfig, ModelRoute
    from orchard.gateway.gateway import Gateway
    from orchard.util.uvicorn_thread import ServerThread

    config = GatewayConfig(models={"policy": ModelRoute(model="openai/scripted", api_base=f"{scripted.url}/v1",
                                                        api_key="unused")})
    with ServerThread(create_app(Gateway(config)), what="the docs' gateway", start_timeout_s=120,
                      stop_timeout_s=15, lifespan="on") as server:
        yield server.url


async def test_harnesses_example_runs_on_a_real_sandbox(scripted, open_gateway, sandbox_home):
    from orchard.sandbox.client import AsyncOrchard

    scripted.load([tool_calls(("submit", {"summary": "nothing to change"}))], loop=True)
    _, code, line = the_block("harnesses.md", "python")
    assert code.count("http://gw:4000/v1") == 1
    task = swe_mini_task("orchard__pagekit-112")
    async with AsyncOrchard(home=sandbox_home) as orch, task_sandbox(orch, task) as sandbox:
        namespace = {"task": task, "sandbox": sandbox}
        await doc_blocks.run_python(code.replace("http://gw:4000/v1", f"{open_gateway}/v1"),
                                    f"harnesses.md:{line}", namespace)
    trajectory = namespace["trajectory"]
    assert trajectory.exit_status == "submitted" and trajectory.rollout_key == "task-3.try-1", trajectory.notes
    assert (namespace["react"].name, namespace["mini"].name) == ("react", "mini-swe-agent")


# --- local-backend.md -----------------------------------------------------------------------------------------

def test_local_backend_launch_command_is_what_the_bundle_gives(tmp_path):
    from orchard.sandbox.bundle import ensure_agent_bundle

    _, code, line = the_block("local-backend.md", "output")
    shown = shlex.split(code.replace("\\\n", " "))
    made = ensure_agent_bundle(tmp_path / "cache").launch_argv("unix:...", "...")
    if platform.machine() != "x86_64":  # the page shows an x86-64 machine's loader
        shown, made = shown[1:], made[1:]
    assert made == shown, f"local-backend.md:{line}"


# --- models.md ------------------------------------------------------------------------------------------------

def test_models_install_lines_are_the_setup_and_the_providers_config_loads():
    doc = page("models.md")
    doc_blocks.check_cli_lines(doc)
    (config,) = doc_blocks.check_data_blocks(doc, "yaml")
    assert set(config.models) == {"claude", "gpt", "policy", "local"}


# --- orchestrator.md ------------------------------------------------------------------------------------------

SIGNATURE = re.compile(r"(?P<name>[\w.]+)\((?P<params>[^()]*)\)")


def test_orchestrator_signatures_are_sandbox_services():
    from orchard.sandbox.server.models import ReconcileReport

    dotted, code, line = the_block("orchestrator.md", "signatures")
    cls = doc_blocks.resolve(dotted)
    statements = re.sub(r"#[^\n]*", "", code)
    statements = re.sub(r"\(([^()]*)\)", lambda m: "(" + " ".join(m.group(1).split()) + ")", statements)
    checked = []
    for text in filter(str.strip, statements.splitlines()):
        awaited = text.lstrip().startswith("await ")
        returns = text.split("->", 1)[1].strip() if "->" in text else None
        for match in SIGNATURE.finditer(text):
            name = match.group("name")
            member = cls.__init__ if name == cls.__name__ else getattr(cls, name.removeprefix(f"{cls.__name__}."))
            where = f"orchestrator.md:{line}: {name}"
            real = [p for p in inspect.signature(member).parameters.values() if p.name not in ("self", "cls")]
            shown = ast.parse(f"def f({match.group('params')}): pass").body[0].args
            shown_params = ([(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in shown.args]
                            + ([(shown.vararg.arg, inspect.Parameter.VAR_POSITIONAL)] if shown.vararg else [])
                            + [(a.arg, inspect.Parameter.KEYWORD_ONLY) for a in shown.kwonlyargs]
                            + ([(shown.kwarg.arg, inspect.Parameter.VAR_KEYWORD)] if shown.kwarg else []))
            assert shown_params == [(p.name, p.kind) for p in real], \
                f"{where}: the real one is {inspect.signature(member)}"
            defaults = dict(zip([a.arg for a in shown.args][::-1], shown.defaults[::-1]))
            defaults |= {a.arg: d for a, d in zip(shown.kwonlyargs, shown.kw_defaults) if d is not None}
            for param in real:
                if param.default is not inspect.Parameter.empty:
                    assert param.name in defaults and ast.literal_eval(defaults[param.name]) == param.default, \
                        f"{where}: {param.name} defaults to {param.default!r}"
                else:
                    assert param.name not in defaults, f"{where}: {param.name} has no default"
            assert inspect.iscoroutinefunction(member) == awaited, f"{where}: awaited as shown?"
            if returns is not None:
                assert inspect.signature(member).return_annotation == returns, f"{where} returns {returns}?"
            checked.append(name)
    assert len(checked) == 13, checked
    shown_fields = re.search(r"reconcile\(\) -> ReconcileReport\s+# (.*)", code).group(1)
    assert [f.strip() for f in shown_fields.split(",")] == list(ReconcileReport.model_fields)


# --- trajectory.md --------------------------------------------------------------------------------------------

def test_trajectory_schema_tree_is_the_model():
    """Each model the tree names lists exactly its fields: a branch line names a model (`agent: Agent`,
    `├─ ToolCall`) whose fields follow, on it and the lines below it, the label before the model being its
    parent's field; `[Model a, b]` lists a nested model's fields inline, `[Model]` alone is a type; branch
    lines without a model list the root's fields; parenthesised text is comment."""
    dotted, code, line = the_block("trajectory.md", "fields")
    root = doc_blocks.resolve(dotted)
    models: dict[str, type[pydantic.BaseModel]] = {}

    def walk(model: type[pydantic.BaseModel]) -> None:
        if model.__name__ in models:
            return
        models[model.__name__] = model
        for field in model.model_fields.values():
            pending = [field.annotation]
            while pending:
                annotation = pending.pop()
                if inspect.isclass(annotation) and issubclass(annotation, pydantic.BaseModel):
                    walk(annotation)
                pending.extend(getattr(annotation, "__args__", ()))

    walk(root)
    text = code
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", " ", text)
    shown: dict[str, set[str]] = {root.__name__: set()}
    owner, nested = root.__name__, []
    first, *rest = text.splitlines()
    assert first.strip() == root.__name__, f"trajectory.md:{line}: the tree starts at {root.__name__}"
    for text_line in rest:
        tokens = re.findall(r"\[|\]|[A-Za-z_]\w*", text_line)
        if re.match(r"^[│ ]*[├└]─", text_line):  # a branch
            named = [index for index, token in enumerate(tokens) if token in models]
            owner = tokens[named[0]] if named else root.__name__
            if named:
                shown.setdefault(owner, set())
                for label in tokens[:named[0]]:
                    if label != "[":
                        parent = root.__name__ if text_line.startswith(("├", "└")) else "(a nested label)"
                        shown.setdefault(parent, set()).add(label)
                tokens = tokens[named[0] + 1:]
                tokens = tokens[1:] if tokens[:1] == ["]"] else tokens
        index = 0
        while index < len(tokens):
            token = tokens[index]
            if token == "[" and tokens[index + 2:index + 3] == ["]"]:  # [Model]: a field's type
                assert tokens[index + 1] in models, f"trajectory.md:{line}: no model {tokens[index + 1]}"
                index += 3
                continue
            if token == "[":
                nested.append(tokens[index + 1])
                shown.setdefault(tokens[index + 1], set())
                index += 2
                continue
            if token == "]":
                nested.pop()
            else:
                shown[nested[-1] if nested else owner].add(token)
            index += 1
    assert set(shown) <= set(models), f"trajectory.md:{line}: no such model {set(shown) - set(models)}"
    for name, fields in shown.items():
        real = set(models[name].model_fields)
        assert fields == real, (f"trajectory.md:{line}: {name} shows {sorted(fields - real)} that it lacks, and "
                                f"leaves out {sorted(real - fields)}")
