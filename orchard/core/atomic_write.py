"""Atomic file writes: a reader sees the old file or the new one, never half of one, and after a crash
the file is either the old or the new one.

The data goes to a temporary file with a unique name in the target's directory (so two writers never
share it and the rename stays on one file system); it is fsync'd, renamed over the target with
`os.replace`, and the directory is fsync'd so the rename itself is durable (`durable=False` skips both
fsyncs, for state that cannot outlive the machine anyway). On any failure the temporary file is removed
and the target is untouched."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int | None = None, durable: bool = True) -> None:
    """Replace `path` with `data`. The file gets `mode`, else the mode of the file it replaces, else the
    mode a plain `open()` would give it (0666 less the umask) — not the 0600 of the temporary file."""
    path = Path(path)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.replace(temporary, path)
        temporary = None
        if durable:
            fsync_directory(path.parent)
    finally:
        if temporary is not None:
            os.unlink(temporary)


def atomic_write_text(path: str | Path, text: str, *, mode: int | None = None, encoding: str = "utf-8",
                      durable: bool = True) -> None:
    """`atomic_write_bytes` of `text` encoded with `encoding`."""
    atomic_write_bytes(path, text.encode(encoding), mode=mode, durable=durable)


def fsync_directory(directory: str | Path) -> None:
    """Make the creations, renames and removals in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, which races with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
