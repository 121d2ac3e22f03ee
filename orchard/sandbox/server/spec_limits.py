"""The most a sandbox spec may ask for on one orchestrator (`SpecLimits`), and where the defaults come from.

A limit the backend cannot enforce must never be silently weakened, and one past what the machine has
is meaningless (a `disk_mb` of an exabyte, `cpu: 1e9`): such a spec is refused at create with
`InvalidRequest` naming the field, its maximum and how to raise it. For the local backend the defaults
come from the machine the sandboxes run on; every maximum can be set with `ORCHARD_MAX_<FIELD>` (or the
`orchard serve --max-...` options), `none` meaning no maximum."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.core.backend import BackendConfig
from orchard.core.errors import InvalidRequest, describe_validation_errors
from orchard.core.sandbox import SandboxSpec

DEFAULT_MAX_TIMEOUT_S = 7 * 24 * 3600.0
# spec field → environment variable that sets its maximum
ENV_VARS = {"cpu": "ORCHARD_MAX_CPU", "memory_mb": "ORCHARD_MAX_MEMORY_MB", "disk_mb": "ORCHARD_MAX_DISK_MB",
            "max_processes": "ORCHARD_MAX_PROCESSES", "timeout_s": "ORCHARD_MAX_TIMEOUT_S"}
CLI_OPTIONS = {"cpu": "--max-cpu", "memory_mb": "--max-memory-mb", "disk_mb": "--max-disk-mb",
               "max_processes": "--max-processes", "timeout_s": "--max-timeout-s"}


class SpecLimits(BaseModel):
    """Maxima for the numeric fields of `SandboxSpec`; None = no maximum. `why` says where each came from
    (shown when a spec is refused)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    cpu: float | None = Field(default=None, gt=0, description="CPU cores")
    memory_mb: int | None = Field(default=None, gt=0)
    disk_mb: int | None = Field(default=None, gt=0)
    max_processes: int | None = Field(default=None, gt=0)
    timeout_s: float | None = Field(default=DEFAULT_MAX_TIMEOUT_S, gt=0, description="TTL (and heartbeat timeout)")
    why: dict[str, str] = Field(default_factory=dict)

    def check(self, spec: SandboxSpec) -> None:
        """Raise InvalidRequest naming the first field of `spec` over its maximum."""
        asked = {"cpu": spec.cpu, "memory_mb": spec.memory_mb, "disk_mb": spec.disk_mb,
                 "max_processes": spec.max_processes, "timeout_s": spec.timeout_s,
                 "heartbeat_timeout_s": spec.heartbeat_timeout_s}
        for field, value in asked.items():
            limit_field = "timeout_s" if field == "heartbeat_timeout_s" else field
            maximum = getattr(self, limit_field)
            if value is not None and maximum is not None and value > maximum:
                source = self.why.get(limit_field, "this orchestrator's setting")
                raise InvalidRequest(
                    f"{field}={_number(value)} is over this orchestrator's maximum of {_number(maximum)} "
                    f"({source}); ask for at most {_number(maximum)}, or have the operator raise it "
                    f"({CLI_OPTIONS[limit_field]} or {ENV_VARS[limit_field]})")

    def overridden(self, values: Mapping[str, str | float | int | None]) -> "SpecLimits":
        """These limits with `values` (field → number, or 'none' for no maximum) applied on top."""
        data = self.model_dump()
        for field, value in values.items():
            if value is None:
                continue
            data[field] = None if str(value).strip().lower() == "none" else value
            data["why"][field] = "set by the operator"
        try:
            return SpecLimits.model_validate(data)
        except ValidationError as e:
            problems = describe_validation_errors(e, "limits")
            raise InvalidRequest(f"invalid sandbox maximum ({problems}); give a positive number or 'none'") from e


def machine_limits(config: BackendConfig, home: Path) -> SpecLimits:
    """Defaults: for a backend whose sandboxes run here (`runs_here`: the local backend) what this
    machine has (its CPU cores, its memory, for `disk_mb` the smaller of its memory — the writable layer
    is a tmpfs — and the free space under `home`, and the kernel's pid_max); for other backends only the
    TTL maximum (this machine says nothing about a cluster's nodes: set the rest explicitly)."""
    if not config.runs_here:
        return SpecLimits()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory_mb = _memory_mb()
    free_mb = _free_mb(home)
    disk_mb = min(memory_mb, free_mb)
    pid_max = _pid_max()
    return SpecLimits(
        cpu=float(cores), memory_mb=memory_mb, disk_mb=disk_mb, max_processes=pid_max,
        why={"cpu": f"this machine's {cores} CPU cores", "memory_mb": f"this machine's {memory_mb} MiB of memory",
             "disk_mb": (f"the writable layer is a tmpfs: at most this machine's memory ({memory_mb} MiB) and "
                         f"the free space under the orchard home ({free_mb} MiB)"),
             "max_processes": f"the kernel's pid_max ({pid_max})",
             "timeout_s": f"the default maximum TTL of {DEFAULT_MAX_TIMEOUT_S / 86400:g} days"})


def spec_limits(config: BackendConfig, home: Path, overrides: Mapping[str, str | float | int | None] | None = None,
                environ: Mapping[str, str] | None = None) -> SpecLimits:
    """The machine's defaults, then `ORCHARD_MAX_*` from the environment, then `overrides` (CLI options)."""
    environ = os.environ if environ is None else environ
    from_env = {field: environ[var] for field, var in ENV_VARS.items() if environ.get(var, "").strip()}
    return machine_limits(config, home).overridden(from_env).overridden(overrides or {})


def _number(value: float | int) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _memory_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def _free_mb(home: Path) -> int:
    path = Path(home)
    while not path.exists() and path != path.parent:  # the home may not exist yet
        path = path.parent
    return max(1, shutil.disk_usage(path).free // (1024 * 1024))


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 32768
