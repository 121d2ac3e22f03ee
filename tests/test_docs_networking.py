"""docs/networking.md, every block checked: the Python example runs as written on the embedded local
backend with the evaluation's own gateway (its route pointed at the scripted model server instead of a
vLLM one), the command lines parse, the Kubernetes config is a valid KubernetesConfig."""

from __future__ import annotations

import pytest

from orchard.testing.scripted_model import create_scripted_app
from orchard.testing.scripted_script import Script
from orchard.util.uvicorn_thread import ServerThread
from tests import doc_blocks

PAGE = doc_blocks.ROOT / "docs" / "networking.md"


def test_the_example_runs_a_harness_call_through_a_model_only_sandbox(sandbox_home, monkeypatch):
    monkeypatch.setenv("ORCHARD_HOME", str(sandbox_home))  # the example's LocalConfig keeps its sandboxes there
    ((_, code, line),) = doc_blocks.of_kind(PAGE, "python")
    assert code.count("http://vllm:8000/v1") == 1
    script = Script.parse({"responses": [{"content": "hello from the policy"}], "loop": True}, where="test")
    with ServerThread(create_scripted_app(script), what="the scripted model server") as model:
        namespace: dict = {}
        doc_blocks.run_python(code.replace("http://vllm:8000/v1", f"{model.url}/v1"), f"networking.md:{line}",
                              namespace)
    assert namespace["answer"] == "hello from the policy\n"
    assert [call.rollout_key for call in namespace["calls"]] == ["task-3.try-1"]


def test_the_command_lines_parse_and_the_kubernetes_config_is_valid():
    doc_blocks.check_cli_lines(PAGE)
    (config,) = doc_blocks.check_data_blocks(PAGE, "yaml")
    assert config.model_gateway == "http://10.96.40.17:4000"
