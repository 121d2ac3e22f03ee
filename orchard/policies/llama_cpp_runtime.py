"""A self-contained `llama-server` (llama.cpp) for the llama_cpp engine of smollm2, built once from Debian's
packages into the cache (`$ORCHARD_HOME/cache/llama-cpp/<key>`), the way harness bundles get their Debian
parts: apt-get with a private configuration downloads the closure of `llama.cpp-tools` (about 18 MB of
.debs, its own glibc and libstdc++ included), `dpkg-deb -x` unpacks it, nothing is installed on the machine.

- Debian 13 trixie has no llama.cpp; it is packaged from forky (Debian 14, testing) on, so that is the suite.
  Testing moves: the packages are whatever forky has on the day of the first build; the manifest records
  their versions, and the built runtime is kept until the cache is removed.
- The programs are linked against a newer glibc than the host's, so the server is started through the
  runtime's own loader with `--library-path` (no patchelf, and the directory can be moved).
- ggml's CPU code comes in per-CPU variants that Debian's libggml looks for only at its installed path
  (`/usr/lib/x86_64-linux-gnu/ggml/backends0`); the server gets the best variant this CPU supports through
  `GGML_BACKEND_PATH` (`backend_for_cpu`).
- Concurrent first uses build once (a lock file beside the directory); a build is made in a temporary
  directory and renamed into place, so a half-built runtime is never used."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from orchard.core.errors import ModelError
from orchard.core.home import resolve_home
from orchard.util import debian

SUITE = "forky"
PACKAGES = ("llama.cpp-tools",)
RECIPE = 1  # bump when the layout below changes: a new key, a fresh build
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
SERVER = "usr/bin/llama-server"
BACKENDS_DIR = f"{LIBRARY_DIR}/ggml/backends0"
MANIFEST = "runtime.json"
# ggml's x86 CPU variants, best first, with the /proc/cpuinfo flags each needs (ggml's CPU_VARIANT lists)
CPU_VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sapphirerapids", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")),
    ("icelake", ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni")),
    ("skylakex", ("avx512f", "avx512bw", "avx512vl")),
    ("haswell", ("avx2", "fma", "f16c", "bmi2")),
    ("sandybridge", ("avx",)),
    ("sse42", ("sse4_2",)),
    ("x64", ()),
)

Progress = Callable[[str], None]


class LlamaCppRuntime(BaseModel):
    """A built runtime: where it is and what it was built from."""

    root: Path
    suite: str
    packages: dict[str, str]  # name -> version

    @property
    def loader(self) -> Path:
        return self.root / LIBRARY_DIR / "ld-linux-x86-64.so.2"

    @property
    def server(self) -> Path:
        return self.root / SERVER

    def command(self, *arguments: str) -> list[str]:
        """argv that runs llama-server with `arguments`, through the runtime's own loader and libraries."""
        libraries = self.root / LIBRARY_DIR
        return [str(self.loader), "--library-path", f"{libraries}:{libraries / 'llama'}", str(self.server),
                *arguments]

    def environment(self) -> dict[str, str]:
        return {"GGML_BACKEND_PATH": str(self.root / BACKENDS_DIR / f"libggml-cpu-{backend_for_cpu()}.so")}


def runtime_key() -> str:
    return hashlib.sha256(f"{RECIPE} {SUITE} {debian.ARCHITECTURE} {' '.join(PACKAGES)}".encode()).hexdigest()[:16]


def runtime_dir(cache_dir: Path | None = None) -> Path:
    # $ORCHARD_HOME/cache, where the agent and harness bundles are kept too
    default = resolve_home() / "cache"
    return Path(cache_dir or default) / "llama-cpp" / runtime_key()


def find_runtime(cache_dir: Path | None = None) -> LlamaCppRuntime | None:
    """The built runtime, or None when there is none yet."""
    manifest = runtime_dir(cache_dir) / MANIFEST
    if not manifest.is_file():
        return None
    return LlamaCppRuntime.model_validate_json(manifest.read_text())


def ensure_runtime(cache_dir: Path | None = None, progress: Progress = lambda line: None) -> LlamaCppRuntime:
    """The runtime, built first if there is none (needs deb.debian.org once)."""
    found = find_runtime(cache_dir)
    if found is not None:
        return found
    target = runtime_dir(cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_runtime(cache_dir)  # built by another process while this one waited
        if found is not None:
            return found
        progress(f"building the llama.cpp runtime ({' '.join(PACKAGES)} from Debian {SUITE}, about 18 MB, "
                 "once)")
        return _build(target, progress)


def _build(target: Path, progress: Progress) -> LlamaCppRuntime:
    downloads = target.parent.parent / "harness-downloads" / "debian"
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        try:
            archives = debian.AptCache(downloads, SUITE).fetch(list(PACKAGES))
        except Exception as exc:  # noqa: BLE001 - any failure to fetch says the same thing to the user
            raise ModelError(f"cannot fetch llama.cpp from Debian {SUITE} ({exc}); the llama_cpp engine needs "
                             "deb.debian.org once (or use the default engine: unset ORCHARD_SMOLLM2_ENGINE)") from None
        progress(f"unpacking {len(archives)} packages")
        debian.extract(archives, scratch)
        if not (scratch / SERVER).is_file():
            raise ModelError(f"Debian {SUITE}'s {' '.join(PACKAGES)} has no {SERVER}; the llama_cpp engine "
                             "cannot be built (use the default engine: unset ORCHARD_SMOLLM2_ENGINE)")
        packages = {deb.name.split("_")[0]: deb.name.split("_")[1].replace("%3a", ":") for deb in archives}
        runtime = LlamaCppRuntime(root=target, suite=SUITE, packages=packages)
        (scratch / MANIFEST).write_text(runtime.model_dump_json(indent=2))
        os.rename(scratch, target)
        progress(f"llama.cpp runtime ready (llama.cpp-tools {packages.get('llama.cpp-tools', '?')})")
        return runtime
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def backend_for_cpu(flags: set[str] | None = None) -> str:
    """The best ggml CPU variant whose instructions this CPU has."""
    flags = cpu_flags() if flags is None else flags
    return next(name for name, needs in CPU_VARIANTS if all(flag in flags for flag in needs))
