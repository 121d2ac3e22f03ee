"""What the figures were measured on: CPU, cores, memory, kernel, OS, Python, package versions."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version

from pydantic import BaseModel


class MachineInfo(BaseModel):
    cpu_model: str
    cpus: int
    memory_gib: float
    kernel: str
    os: str
    python: str
    orchard: str
    swe_rex: str

    def labelled(self) -> list[tuple[str, str]]:
        return [("CPU", self.cpu_model), ("CPUs", str(self.cpus)), ("memory", f"{self.memory_gib} GiB"),
                ("kernel", self.kernel), ("OS", self.os), ("Python", self.python),
                ("orchard", self.orchard), ("SWE-ReX", self.swe_rex)]

    def summary(self) -> str:
        return f"{self.cpu_model}, {self.cpus} CPUs, {self.memory_gib:.0f} GiB, Linux {self.kernel}"


def _first_value(path: str, key: str, default: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":" if ":" in line else "=")
                if name.strip() == key:
                    return value.strip().strip('"')
    except OSError:
        pass
    return default


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def load_average_1m() -> float:
    return os.getloadavg()[0]


def collect_machine_info() -> MachineInfo:
    mem_kib = int(_first_value("/proc/meminfo", "MemTotal", "0 kB").split()[0])
    return MachineInfo(
        cpu_model=_first_value("/proc/cpuinfo", "model name", platform.processor() or "unknown"),
        cpus=len(os.sched_getaffinity(0)),
        memory_gib=round(mem_kib / 1024 / 1024, 1),
        kernel=platform.release(),
        os=_first_value("/etc/os-release", "PRETTY_NAME", platform.system()),
        python=platform.python_version(),
        orchard=_package_version("orchard"),
        swe_rex=_package_version("swe-rex"),
    )
