"""The Kubernetes backend's typed config (defaults from ORCHARD_K8S_* and KUBECONFIG) and what it can
enforce."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Mapping

from pydantic import Field, field_validator

from orchard.core.backend import BackendCapabilities, BackendConfig
from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.kubernetes.gateway import parse_model_gateway
from orchard.util.env import env_flag

DEFAULT_NAMESPACE = "orchard-sandboxes"
POD_PIDS_LIMIT_ENV = "ORCHARD_K8S_POD_PIDS_LIMIT"


class KubernetesConfig(BackendConfig):
    """One Pod per sandbox in `namespace`; see docs/kubernetes.md for each option's environment variable."""

    backend: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(default=DEFAULT_NAMESPACE, description="created if missing")
    instance: str = Field(default="default", description="label scoping this orchestrator's sandboxes")
    agent_image: str | None = Field(default=None, description="the agent-injector image "
                                                              "(default localhost/orchard-agent:<bundle key>)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    default_image: str | None = Field(default=None, description="the image used for image 'host'")
    kubeconfig: str | None = Field(default=None, description="else in-cluster config, else ~/.kube/config")
    bundle_cache_dir: Path | None = None
    agent_bundle_dir: Path | None = Field(default=None, description="a prebuilt agent bundle (the injector's)")
    ready_timeout_s: float = Field(default=120.0, gt=0)
    health_timeout_s: float = Field(default=5.0, gt=0)
    max_parallel: int = Field(default=16, gt=0, description="API calls of creates/deletes in flight")
    egress_guard: bool = Field(default=True, description="enforce network none/allowlist inside each Pod too "
                                                         "(off only where a policy-capable CNI enforces them)")
    pod_pids_limit: int | None = Field(
        default=None, gt=0, description="the nodes' kubelet podPidsLimit: Kubernetes caps processes per Pod "
                                        "only there, so max_processes is honoured only when it is declared")

    @field_validator("model_gateway")
    @classmethod
    def _gateway_address(cls, value: str | None) -> str | None:
        parse_model_gateway(value)
        return value

    @classmethod
    def from_env(cls, home: Path, environ: Mapping[str, str]) -> "KubernetesConfig":
        def env(name: str) -> str | None:
            return (environ.get(name) or "").strip() or None

        values = {"namespace": env("ORCHARD_K8S_NAMESPACE"), "instance": env("ORCHARD_K8S_INSTANCE"),
                  "agent_image": env("ORCHARD_K8S_AGENT_IMAGE"),
                  "image_pull_policy": env("ORCHARD_K8S_IMAGE_PULL_POLICY"),
                  "default_image": env("ORCHARD_K8S_DEFAULT_IMAGE"), "kubeconfig": env("KUBECONFIG"),
                  "agent_bundle_dir": env("ORCHARD_K8S_AGENT_BUNDLE"),
                  "egress_guard": env_flag(env("ORCHARD_K8S_EGRESS_GUARD"), "ORCHARD_K8S_EGRESS_GUARD"),
                  "pod_pids_limit": env(POD_PIDS_LIMIT_ENV)}
        return cls.model_validate({"bundle_cache_dir": home / "cache",
                                   **{k: v for k, v in values.items() if v is not None}})


def k8s_capabilities(pod_pids_limit: int | None, default_image: str | None,
                     model_gateway: bool = False) -> BackendCapabilities:
    """Every network mode (NetworkPolicy plus the in-Pod egress guard), cpu/memory/disk as container
    limits, max_processes only with a declared node `pod_pids_limit`; OCI images, and 'host' when a
    `default_image` says what it means."""
    limits = {"cpu", "memory_mb", "disk_mb"} | ({"max_processes"} if pod_pids_limit else set())
    return BackendCapabilities(network_modes=frozenset({"none", "allowlist", "open"}), limits=frozenset(limits),
                               image_kinds=frozenset({"oci", "host"} if default_image else {"oci"}),
                               model_gateway=model_gateway, harness_bundles=True)


def check_pids(spec: SandboxSpec, pod_pids_limit: int | None) -> None:
    """The node's per-Pod cap holds `max_processes` only when it is no higher than what the spec asks."""
    if spec.max_processes is not None and pod_pids_limit and spec.max_processes < pod_pids_limit:
        raise InvalidRequest(
            f"max_processes={spec.max_processes} cannot be enforced by the kubernetes backend: its nodes cap a "
            f"Pod at {pod_pids_limit} processes (the kubelet's podPidsLimit, {POD_PIDS_LIMIT_ENV}) and nothing "
            f"per Pod is stricter; ask for at least {pod_pids_limit} or null")
