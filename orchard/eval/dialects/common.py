"""What both task-directory dialects share: reading `task.toml` into a pydantic model with a one-line error
naming the task directory and the key, a directory's files as TaskFiles placed under a path in the sandbox,
and a shell command that unpacks files it carries (the reference solution the oracle plays)."""

from __future__ import annotations

import base64
import gzip
import io
import os
import posixpath
import shlex
import tarfile
import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from orchard.core.errors import describe_validation_errors
from orchard.core.task import TaskFile

TASK_TOML = "task.toml"
INSTRUCTION_MD = "instruction.md"
# Never part of a task's files: caches and an existing git directory.
IGNORED_NAMES = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache"})

_Model = TypeVar("_Model", bound=BaseModel)


class TaskDirError(ValueError):
    """A task directory that cannot be read; the message names the directory and the part."""


def read_toml(directory: Path, model: type[_Model]) -> _Model:
    path = directory / TASK_TOML
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TaskDirError(f"task {directory.name}: {TASK_TOML} cannot be read: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise TaskDirError(f"task {directory.name}: {TASK_TOML}: {describe_validation_errors(exc, limit=1)}") from None


def read_text(directory: Path, relative: str) -> str:
    path = directory / relative
    if not path.is_file():
        raise TaskDirError(f"task {directory.name}: {relative} is missing")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskDirError(f"task {directory.name}: {relative} cannot be read: {exc}") from None


def _walk(root: Path):
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_NAMES)
        for name in sorted(names):
            if not name.endswith(".pyc"):
                yield Path(top, name)


def dir_files(root: Path, under: str) -> list[TaskFile]:
    """Every file below `root`, placed at `under`/<its path below root> (executables keep their mode)."""
    files = []
    for path in _walk(root):
        data = path.read_bytes()
        mode = path.stat().st_mode & 0o777
        try:
            content, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            content, encoding = base64.b64encode(data).decode("ascii"), "base64"
        files.append(TaskFile(path=posixpath.join(under, path.relative_to(root).as_posix()), content=content,
                              encoding=encoding, mode=mode if mode & 0o111 else None))
    return files


def _content_only(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    info.pax_headers = {}
    return info


def unpack_command(task_dir: Path, parts: list[str], then: str) -> str:
    """One shell command: unpack the task directory's `parts` (as they are laid out in it) into a fresh
    temporary directory, `$ORCHARD_TASK_DIR`, run `then` there, and remove the directory. The files travel as
    base64 text, which any harness's shell tool carries verbatim."""
    buffer = io.BytesIO()
    # The same files give the same command, so the suite's hash (a run's resume key) is the same in every
    # process: gzip's header time is fixed, and each entry keeps only its name, content and mode (not the
    # file's mtime or owner, which a checkout or a copy changes).
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed, \
            tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for part in parts:
            if (task_dir / part).exists():
                for path in _walk(task_dir / part):
                    tar.add(path, arcname=path.relative_to(task_dir).as_posix(), recursive=False,
                            filter=_content_only)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    # a subshell: a harness's persistent shell must survive the `exit`
    return (f"(ORCHARD_TASK_DIR=$(mktemp -d) && printf '%s' {shlex.quote(encoded)} | base64 -d | "
            f'tar -xzf - -C "$ORCHARD_TASK_DIR" && ({then}); status=$?; rm -rf "$ORCHARD_TASK_DIR"; '
            "exit $status)")
