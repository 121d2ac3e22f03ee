"""The local backend's typed config and what it can enforce."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar, Literal, Mapping

from pydantic import Field, field_validator

from orchard.core.backend import BackendCapabilities, BackendConfig
from orchard.sandbox.backends.gateway_socket import socket_path
import orchard.sandbox.backends.local.netns as netns

AGENT_APART_ENV = "ORCHARD_LOCAL_AGENT_APART"
ZYGOTE_ENV = "ORCHARD_LOCAL_ZYGOTE"


class LocalConfig(BackendConfig):
    """Sandboxes on this machine (bubblewrap). Paths default to the Orchard home's (`from_env`)."""

    backend: Literal["local"] = "local"
    runs_here: ClassVar[bool] = True
    home: Path | None = Field(default=None, description="the orchestrator's home, whose state db holds every "
                                                        "sandbox's token: hidden from sandboxes like the "
                                                        "directories below (default $ORCHARD_HOME)")
    root_dir: Path | None = Field(default=None, description="the sandboxes' private directories "
                                                            "(default $ORCHARD_HOME/sandboxes)")
    run_dir: Path | None = Field(default=None, description="their sockets (default <tmp>/orchard-run-<uid>, "
                                                           "short for the 108-byte socket path limit)")
    bundle_cache_dir: Path | None = Field(default=None, description="the agent bundle (default $ORCHARD_HOME/cache)")
    image_dir: Path | None = Field(default=None, description="imported OCI images, run as image 'oci:NAME' "
                                                             "(default $ORCHARD_HOME/images)")
    ready_timeout_s: float = Field(default=30.0, gt=0)
    agent_apart: bool = Field(default=False, description="run the agent under a uid of its own (root only; "
                                                         f"{AGENT_APART_ENV}=1); see docs/local-backend.md")
    zygote: bool | None = Field(default=None, description="fork each agent from one pre-started interpreter "
                                                          "instead of starting one per sandbox (root only; "
                                                          f"default on, off with {ZYGOTE_ENV}=0); see "
                                                          "docs/local-backend.md#start-path")
    spares: int = Field(default=1, ge=0, le=8, description="sandboxes' cgroups made ahead of their creates, "
                                                         "with the processes that start a sandbox already in "
                                                         "them (with the zygote, cgroup v1; 0: none); see "
                                                         "docs/local-backend.md#spares")

    @field_validator("model_gateway")
    @classmethod
    def _gateway_socket(cls, value: str | None) -> str | None:
        socket_path(value, "local")
        return value

    @classmethod
    def from_env(cls, home: Path, environ: Mapping[str, str]) -> "LocalConfig":
        return cls(home=home, root_dir=home / "sandboxes", bundle_cache_dir=home / "cache", image_dir=home / "images",
                   agent_apart=environ.get(AGENT_APART_ENV) == "1")


def local_capabilities(model_gateway: bool = False) -> BackendCapabilities:
    """Network 'none' (loopback only) and 'open', 'allowlist' as root with ip, nft and nsenter
    (netns.py); every limit, `disk_mb` only as root (a size-limited tmpfs needs the mount); task services
    as root (their agent runs apart, keeping the capability to start them as their own user). Whether
    this machine's cgroups have each controller is checked per spec at create (limits.py): a limit
    they cannot hold is refused there."""
    limits = {"cpu", "memory_mb", "max_processes"} | ({"disk_mb"} if os.geteuid() == 0 else set())
    modes = {"none", "open"} | ({"allowlist"} if netns.unavailable_reason() is None else set())
    return BackendCapabilities(network_modes=frozenset(modes), limits=frozenset(limits),
                               image_kinds=frozenset({"host", "rootfs", "oci"}), model_gateway=model_gateway,
                               harness_bundles=True, services=os.geteuid() == 0)
