"""JSON Lines files of pydantic models (trajectories, tasks): one model per line, in Orchard's own JSON.

Writing a whole file is atomic (`orchard.core.atomic_write.atomic_write_bytes`), so readers never see half a
file. Appending is how a resumable evaluation records results: each
line is written, flushed and fsync'd on its own, under an exclusive lock, so a crash loses at most the line
being written. Such an interrupted line (the file's last, with no newline) is skipped by `read_jsonl` and
cut off by the next append."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import BaseModel, ValidationError

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.errors import InvalidRequest, first_problem, NotFound
from orchard.core.trajectory import Trajectory

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def write_jsonl(path: str | Path, items: Iterable[BaseModel], *, append: bool = False) -> None:
    """Write `items` to `path`, replacing it atomically; with `append=True`, add them durably one by one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if append:
        _append(path, items)
    else:
        _replace(path, items)


def read_jsonl(path: str | Path, model: type[M] = Trajectory, *, allow_interrupted_tail: bool = True) -> list[M]:
    """Every line of `path` as a `model`. With `allow_interrupted_tail`, an invalid last line without a
    newline (a crash during an append) is skipped with a warning instead of failing the whole read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{path} does not exist") from None
    except IsADirectoryError:
        raise InvalidRequest(f"{path} is a directory; expected a .jsonl file") from None
    lines = data.split(b"\n")
    unterminated = lines.pop()  # b"" when the file ends with a newline
    items: list[M] = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            items.append(_parse(path, number, line, model))
    if unterminated.strip():
        try:
            items.append(_parse(path, len(lines) + 1, unterminated, model))
        except InvalidRequest:
            if not allow_interrupted_tail:
                raise
            log.warning("%s: skipping its last line, which is incomplete (an interrupted write)", path)
    return items


def _parse(path: Path, number: int, line: bytes, model: type[M]) -> M:
    try:
        return model.model_validate_json(line)
    except ValidationError as exc:
        raise InvalidRequest(f"{path}:{number}: not a valid {model.__name__} "
                             f"({first_problem(exc.errors(), 'line')})") from None


def _line(item: BaseModel) -> bytes:
    return item.model_dump_json().encode() + b"\n"


def _replace(path: Path, items: Iterable[BaseModel]) -> None:
    atomic_write_bytes(path, b"".join(_line(item) for item in items))


def _append(path: Path, items: Iterable[BaseModel]) -> None:
    with open(path, "ab+") as out:
        fcntl.flock(out.fileno(), fcntl.LOCK_EX)  # several writers may share one results file
        try:
            _end_interrupted_line(path, out)
            for item in items:
                out.write(_line(item))
                out.flush()
                os.fsync(out.fileno())
        finally:
            fcntl.flock(out.fileno(), fcntl.LOCK_UN)


def _end_interrupted_line(path: Path, out: BinaryIO) -> None:
    """A last line without a newline is a write cut short: complete it if it parses, else cut it off, so
    the next line does not get glued onto it."""
    size = out.seek(0, os.SEEK_END)
    if size == 0:
        return
    out.seek(size - 1)
    if out.read(1) == b"\n":
        return
    start, position, chunk = 0, size, 1 << 16
    while position > 0:
        begin = max(0, position - chunk)
        out.seek(begin)
        newline = out.read(position - begin).rfind(b"\n")
        if newline >= 0:
            start = begin + newline + 1
            break
        position = begin
    out.seek(start)
    try:
        json.loads(out.read())
    except ValueError:
        log.warning("%s: removing an incomplete last line (an interrupted write) before appending", path)
        out.truncate(start)
        out.seek(start)
        return
    out.seek(0, os.SEEK_END)
    out.write(b"\n")
