"""The docker backend's typed config (defaults from DOCKER_HOST and ORCHARD_DOCKER_*) and what it can
enforce."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import ClassVar, Literal, Mapping

from pydantic import Field, field_validator

from orchard.core.backend import BackendCapabilities, BackendConfig
from orchard.sandbox.backends.gateway_socket import socket_path
from orchard.util.env import env_flag

SYSTEM_SOCKET = "unix:///var/run/docker.sock"
# What scripts/docker/daemon.sh builds (`daemon.sh image`): Debian with python3, pytest and git.
DEFAULT_IMAGE = "localhost/orchard-debian:bookworm"


class DockerConfig(BackendConfig):
    """One container per sandbox on a Docker Engine API (Docker, or Podman's Docker-compatible socket) on
    this machine; see docs/docker.md for each option's environment variable."""

    backend: Literal["docker"] = "docker"
    # The daemon is on this machine: its sockets and directories are bind-mounted from here.
    runs_here: ClassVar[bool] = True
    base_url: str = Field(default=SYSTEM_SOCKET, description="the Engine API: unix:///path.sock (or tcp://, "
                                                             "for a daemon on this same machine)")
    instance: str = Field(default="default", description="label scoping this orchestrator's sandboxes")
    default_image: str | None = Field(default=DEFAULT_IMAGE, description="the image used for image 'host'")
    pull: Literal["missing", "never", "always"] = Field(
        default="missing", description="pull an image the daemon lacks (missing), never, or before each create")
    runtime: str | None = Field(default=None, description="an OCI runtime the daemon knows (e.g. runsc); "
                                                          "None: the daemon's default")
    init: bool = Field(default=True, description="docker-init as PID 1: reaps the zombies of the workload")
    disk_quota: bool = Field(default=False, description="enforce disk_mb as the container's storage-opt size "
                                                        "(overlay2 on xfs with pquota, or devicemapper/btrfs/zfs)")
    run_dir: Path | None = Field(default=None, description="host directory of the agents' sockets and token "
                                                           "files (default <tmp>/orchard-docker-<uid>)")
    bundle_cache_dir: Path | None = None
    ready_timeout_s: float = Field(default=60.0, gt=0)
    max_parallel: int = Field(default=16, gt=0, description="Engine API calls of creates/deletes in flight")

    @field_validator("model_gateway")
    @classmethod
    def _gateway_socket(cls, value: str | None) -> str | None:
        socket_path(value, "docker")
        return value

    @classmethod
    def from_env(cls, home: Path, environ: Mapping[str, str]) -> "DockerConfig":
        def env(name: str) -> str | None:
            return (environ.get(name) or "").strip() or None

        values = {"base_url": env("DOCKER_HOST") or default_base_url(environ),
                  "instance": env("ORCHARD_DOCKER_INSTANCE"),
                  "default_image": env("ORCHARD_DOCKER_DEFAULT_IMAGE"), "pull": env("ORCHARD_DOCKER_PULL"),
                  "runtime": env("ORCHARD_DOCKER_RUNTIME"), "run_dir": env("ORCHARD_DOCKER_RUN_DIR"),
                  "disk_quota": env_flag(env("ORCHARD_DOCKER_DISK_QUOTA"), "ORCHARD_DOCKER_DISK_QUOTA")}
        return cls.model_validate({"bundle_cache_dir": home / "cache",
                                   **{k: v for k, v in values.items() if v is not None}})


def daemon_script_socket(environ: Mapping[str, str]) -> Path:
    """Where scripts/docker/daemon.sh puts its daemon's socket (${ORCHARD_DOCKER_DIR:-~/.orchard/docker})."""
    workdir = environ.get("ORCHARD_DOCKER_DIR") or str(Path(environ.get("HOME") or Path.home()) / ".orchard" / "docker")
    return Path(workdir) / "docker.sock"


def default_base_url(environ: Mapping[str, str]) -> str:
    """Without DOCKER_HOST: the daemon of scripts/docker/daemon.sh when its socket is there, else the
    system's."""
    socket = daemon_script_socket(environ)
    return f"unix://{socket}" if socket.is_socket() else SYSTEM_SOCKET


def default_run_dir() -> Path:
    """Short (the 108-byte limit of a socket path) and private to this uid."""
    return Path(tempfile.gettempdir()) / f"orchard-docker-{os.getuid()}"


def docker_capabilities(disk_quota: bool, default_image: str | None,
                        model_gateway: bool = False) -> BackendCapabilities:
    """Network none (no interface but loopback) and open (the daemon's bridge), and the model gateway
    beside either when one is configured (`model_gateway`, its Unix socket); no allowlist. cpu, memory (no
    swap on top) and processes as the container's cgroup limits; disk only with `disk_quota`. OCI images,
    and 'host' when a `default_image` says what it means. Harness bundles, bound from this machine's cache
    (the daemon runs here)."""
    limits = {"cpu", "memory_mb", "max_processes"} | ({"disk_mb"} if disk_quota else set())
    return BackendCapabilities(network_modes=frozenset({"none", "open"}), limits=frozenset(limits),
                               image_kinds=frozenset({"oci", "host"} if default_image else {"oci"}),
                               harness_bundles=True, model_gateway=model_gateway)
