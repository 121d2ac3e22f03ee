"""What the docker backend asks the Engine API for, for one sandbox: the container's name, labels and
create parameters. The labels are the source of truth for re-adoption (`list_live`): they say which
orchestrator instance a container belongs to, its sandbox, owner, deadline and host directory."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import HARNESS_MOUNT_ROOT, SandboxSpec
from orchard.sandbox.bundle import DEFAULT_MOUNT_POINT, AgentBundle
from orchard.sandbox.images.refs import strip_oci_prefix

MANAGED_BY_LABEL = "orchard.dev/managed-by"
MANAGED_BY_VALUE = "orchard"
SANDBOX_LABEL = "orchard.dev/sandbox"
INSTANCE_LABEL = "orchard.dev/instance"
OWNER_LABEL = "orchard.dev/owner"
DEADLINE_LABEL = "orchard.dev/deadline"
CREATED_LABEL = "orchard.dev/created"
RUN_DIR_LABEL = "orchard.dev/run-dir"
TOKEN_MOUNT = "/.orchard-token"
GATEWAY_MOUNT = "/.orchard-gateway.sock"  # the model gateway's Unix socket, with network.gateway
SOCKET_MOUNT = f"{DEFAULT_MOUNT_POINT}/run"  # the bundle's empty run/ directory
HARNESS_TMPFS_BYTES = 64 << 10
# Docker's own bounds: a quota under 1/100 CPU and memory under 6 MiB are refused.
MIN_CPU = 0.01
MIN_MEMORY_MB = 6
# The container's stdout/stderr is the agent's (commands' output goes through the agent): a small cap.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}}
NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class DockerHandle(BaseModel):
    """BackendSandbox.handle of a docker sandbox."""

    container_id: str
    name: str
    run_dir: str
    owner: str = ""
    deadline: float = 0.0


def container_name(instance: str, sandbox_id: str) -> str:
    return f"orchard-{instance}-{sandbox_id}"


def validate_sandbox_id(sandbox_id: str) -> None:
    if not NAME_PART.fullmatch(sandbox_id):
        raise InvalidRequest(f"sandbox id {sandbox_id!r} cannot name a container: use 1-128 letters, digits, "
                             "'_', '.' or '-', starting with a letter or digit")


def validate_instance(instance: str) -> None:
    if len(instance) > 63 or not NAME_PART.fullmatch(instance):
        raise InvalidRequest(f"instance {instance!r}: use 1-63 letters, digits, '_', '.' or '-', starting with "
                             "a letter or digit")


def instance_filters(instance: str) -> dict:
    return {"label": [f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}", f"{INSTANCE_LABEL}={instance}"]}


def resolve_image(spec: SandboxSpec, default_image: str | None) -> str:
    """The image to run: the spec's (`oci:NAME` is NAME), or for `host` the configured default."""
    if spec.image != "host":
        return strip_oci_prefix(spec.image)
    if default_image:
        return default_image
    raise InvalidRequest("image 'host' means the docker backend's default image, and none is configured: pass "
                         "an image (e.g. image='debian:bookworm') or set ORCHARD_DOCKER_DEFAULT_IMAGE")


def validate_limits(spec: SandboxSpec) -> None:
    if spec.cpu is not None and spec.cpu < MIN_CPU:
        raise InvalidRequest(f"cpu={spec.cpu:g}: Docker enforces CPU quotas of at least {MIN_CPU} of a core")
    if spec.memory_mb is not None and spec.memory_mb < MIN_MEMORY_MB:
        raise InvalidRequest(f"memory_mb={spec.memory_mb}: Docker enforces memory limits of at least "
                             f"{MIN_MEMORY_MB} MiB")


def labels(sandbox_id: str, instance: str, owner: str, spec: SandboxSpec, run_dir: str,
           now: float | None = None) -> dict[str, str]:
    now = time.time() if now is None else now
    return {MANAGED_BY_LABEL: MANAGED_BY_VALUE, INSTANCE_LABEL: instance, SANDBOX_LABEL: sandbox_id,
            OWNER_LABEL: owner, DEADLINE_LABEL: f"{now + spec.timeout_s:.3f}", CREATED_LABEL: f"{now:.3f}",
            RUN_DIR_LABEL: run_dir}


def host_config_options(spec: SandboxSpec, *, bundle: AgentBundle, token_file: str, sock_dir: str,
                        init: bool, runtime: str | None, disk_quota: bool,
                        harness_bundles: Sequence[tuple[str, Path]] = (), gateway_socket: Path | None = None) -> dict:
    """Keyword arguments of `APIClient.create_host_config`: mounts, network, limits. Memory swap equals
    memory, so the limit is not stretched by swap. `harness_bundles` ((name, host directory) pairs) are
    bound read-only at HARNESS_MOUNT_ROOT/<name>, on a tiny read-only tmpfs: the agent bundle's harness/
    is read-only, so their mount points cannot be made in it. `gateway_socket`: the model gateway's, bound
    read-only at GATEWAY_MOUNT (the agent relays 127.0.0.1:4000 of the container's own namespace to it, with
    network `none` as with the bridge)."""
    from docker.types import Mount

    options: dict = {
        "mounts": [Mount(DEFAULT_MOUNT_POINT, str(bundle.path), type="bind", read_only=True),
                   Mount(SOCKET_MOUNT, sock_dir, type="bind"),
                   Mount(TOKEN_MOUNT, token_file, type="bind", read_only=True)],
        "network_mode": "none" if spec.network.mode == "none" else "bridge",
        "init": init,
        "log_config": LOG_CONFIG,
    }
    if harness_bundles:
        options["mounts"].append(Mount(HARNESS_MOUNT_ROOT, None, type="tmpfs", read_only=True,
                                       tmpfs_size=HARNESS_TMPFS_BYTES, tmpfs_mode=0o755))
        options["mounts"] += [Mount(f"{HARNESS_MOUNT_ROOT}/{name}", str(path), type="bind", read_only=True)
                              for name, path in harness_bundles]
    if gateway_socket is not None:
        options["mounts"].append(Mount(GATEWAY_MOUNT, str(gateway_socket), type="bind", read_only=True))
    if runtime:
        options["runtime"] = runtime
    if spec.cpu is not None:
        options["nano_cpus"] = round(spec.cpu * 1e9)
    if spec.memory_mb is not None:
        options["mem_limit"] = options["memswap_limit"] = spec.memory_mb * 1024 * 1024
    if spec.max_processes is not None:
        options["pids_limit"] = spec.max_processes
    if spec.disk_mb is not None and disk_quota:
        options["storage_opt"] = {"size": f"{spec.disk_mb}M"}
    return options


def container_options(sandbox_id: str, spec: SandboxSpec, image: str, *, bundle: AgentBundle,
                      container_labels: dict[str, str], gateway: bool = False) -> dict:
    """Keyword arguments of `APIClient.create_container` (host_config apart): the image's entrypoint is
    replaced by the agent, started through the bundled loader; it listens on a Unix socket in the mounted
    run directory. The token reaches it only as a file. The agent makes the workdir (as the image's user)
    and says so when it cannot."""
    argv = bundle.launch_argv(listen=f"unix:{SOCKET_MOUNT}/agent.sock", workdir=spec.workdir)
    if gateway:
        argv += ["--gateway", f"unix:{GATEWAY_MOUNT}"]
    env = {**spec.env, **bundle.launch_env(), "ORCHARD_AGENT_TOKEN_FILE": TOKEN_MOUNT}
    return {"image": image, "entrypoint": argv[:1], "command": argv[1:], "environment": env,
            "labels": container_labels,
            "hostname": sandbox_id if HOSTNAME.fullmatch(sandbox_id) else "sandbox"}
