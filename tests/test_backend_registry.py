"""Backends as plug-ins: found by entry point, configured by a typed config (from the environment, a
file, or code), and a spec asking for what a backend lacks refused at create, naming the backend and what
it lacks — through the real embedded orchestrator and the real `orchard` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.core.backend import BackendCapabilities, image_kind
from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.kubernetes.config import KubernetesConfig
from orchard.sandbox.backends.local.config import LocalConfig
from orchard.sandbox.backends.registry import (available_backends, backend_class, backend_config,
                                               create_backend, parse_backend_config)
from orchard.sandbox.client import AsyncOrchard


def test_built_in_backends_are_entry_points():
    assert {"local", "kubernetes", "docker"} <= set(available_backends())
    assert backend_class("local").Config is LocalConfig
    assert backend_class("kubernetes").Config is KubernetesConfig


def test_an_unknown_backend_names_the_available_ones(tmp_path):
    with pytest.raises(InvalidRequest, match="unknown backend 'nope'; available: .*local"):
        backend_config("nope", tmp_path)


def test_configs_take_defaults_from_the_home_and_the_environment(tmp_path):
    local = backend_config("local", tmp_path, environ={"ORCHARD_LOCAL_AGENT_APART": "1"})
    assert local == LocalConfig(home=tmp_path, root_dir=tmp_path / "sandboxes", bundle_cache_dir=tmp_path / "cache",
                                image_dir=tmp_path / "images", agent_apart=True)
    k8s = backend_config("kubernetes", tmp_path, environ={"ORCHARD_K8S_NAMESPACE": "ns",
                                                          "ORCHARD_K8S_POD_PIDS_LIMIT": "256"})
    assert (k8s.namespace, k8s.pod_pids_limit, k8s.instance) == ("ns", 256, "default")
    # a file's fields go on top of those defaults; `backend` picks the config class
    parsed = parse_backend_config({"backend": "kubernetes", "instance": "ci"}, tmp_path,
                                  environ={"ORCHARD_K8S_NAMESPACE": "ns"})
    assert isinstance(parsed, KubernetesConfig) and (parsed.namespace, parsed.instance) == ("ns", "ci")


def test_a_bad_config_names_the_backend_and_the_field(tmp_path):
    with pytest.raises(InvalidRequest, match="kubernetes backend's config: image_pull_policy"):
        backend_config("kubernetes", tmp_path, image_pull_policy="Sometimes")
    with pytest.raises(InvalidRequest, match="local backend's config: namespace: unknown field"):
        parse_backend_config({"backend": "local", "namespace": "x"}, tmp_path)
    with pytest.raises(InvalidRequest, match="needs a 'backend' field"):
        parse_backend_config({"namespace": "x"}, tmp_path)
    with pytest.raises(InvalidRequest, match="ORCHARD_K8S_EGRESS_GUARD='maybe'"):
        backend_config("kubernetes", tmp_path, environ={"ORCHARD_K8S_EGRESS_GUARD": "maybe"})


def test_capabilities_name_everything_a_spec_lacks():
    caps = BackendCapabilities(network_modes=frozenset({"none"}), limits=frozenset({"cpu"}),
                               image_kinds=frozenset({"oci"}))
    spec = SandboxSpec(image="/srv/rootfs", memory_mb=64, network={"mode": "open"})
    with pytest.raises(InvalidRequest) as caught:
        caps.check(spec, "acme")
    message = str(caught.value)
    assert message.startswith("the acme backend cannot honour this sandbox spec")
    for lacking in ("network mode 'open'", "the memory_mb limit", "the max_processes limit",
                    "images of kind 'rootfs'"):
        assert lacking in message
    # an unset limit needs no capability
    assert caps.lacks(SandboxSpec(image="debian:bookworm", cpu=1, max_processes=None)) == []
    assert [image_kind(i) for i in ("host", "/srv/x", "python:3.12")] == ["host", "rootfs", "oci"]


def test_kubernetes_honours_max_processes_only_against_a_declared_node_cap(tmp_path):
    without = create_backend(backend_config("kubernetes", tmp_path, environ={}))
    assert "max_processes" not in without.capabilities.limits
    with_cap = create_backend(backend_config("kubernetes", tmp_path, environ={}, pod_pids_limit=512))
    assert "max_processes" in with_cap.capabilities.limits


async def test_the_orchestrator_refuses_what_the_local_backend_lacks(sandbox_home):
    async with AsyncOrchard(home=sandbox_home, backend="local") as orch:
        # It runs OCI images it has imported (docs/images.md): one it has not is refused by name.
        with pytest.raises(InvalidRequest, match="image 'python:3.12' is not imported.*orchard image import FILE"):
            await orch.create(image="python:3.12")
        assert await orch.list() == []  # nothing was made
        sandbox = await orch.create()  # what it has still works
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"


async def test_a_backend_config_object_runs_the_embedded_orchestrator(sandbox_home, tmp_path):
    config = backend_config("local", sandbox_home, ready_timeout_s=20)
    async with AsyncOrchard(home=sandbox_home, backend=config) as orch:
        sandbox = await orch.create()
        assert (await orch.get(sandbox.id)).backend == "local"
    with pytest.raises(InvalidRequest, match="uses its own"):
        AsyncOrchard("http://127.0.0.1:1", backend="local")


def _orchard(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORCHARD_HOME": str(home), "COLUMNS": "400", "ORCHARD_API_KEY": "k"}  # rows on one line
    return subprocess.run([sys.executable, "-m", "orchard.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_cli_lists_backends_with_their_capabilities(tmp_path):
    listed = _orchard("backend", "list", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    local = next(line for line in listed.stdout.splitlines() if "│ local" in line)
    assert "none, open" in local and "host, oci, rootfs" in local and "root_dir" in local


def test_cli_refuses_a_bad_backend_config_file(tmp_path):
    bad = tmp_path / "backend.json"
    bad.write_text(json.dumps({"backend": "kubernetes", "namespace": 3}))
    ran = _orchard("serve", "--backend-config", str(bad), "--port", "1", home=tmp_path)
    assert ran.returncode == 2 and "kubernetes backend's config: namespace" in ran.stderr, ran.stderr
    ran = _orchard("serve", "--backend", "local", "--backend-config", str(bad), "--port", "1", home=tmp_path)
    assert ran.returncode == 2 and "is for 'kubernetes'" in ran.stderr, ran.stderr
    ran = _orchard("serve", "--backend-config", str(tmp_path / "missing.yaml"), "--port", "1", home=tmp_path)
    assert ran.returncode == 2 and "does not exist" in ran.stderr, ran.stderr
