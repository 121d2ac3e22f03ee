"""Directory trees as tar streams with flat memory, for the agent client's `upload` / `download`.

`tarfile` is blocking, so it runs in a worker thread on one end of an OS pipe while the event loop reads or
writes the other end. At most a pipe's worth (≤ 1 MiB) plus one chunk is in flight, whatever the tree's
size. Closing either end unblocks the other side (EOF or EPIPE), so an abandoned transfer never strands a
thread."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import tarfile
import threading
from pathlib import Path
from typing import AsyncIterator, Callable

from orchard.sandbox.agent.tars import merge_tree

CHUNK = 1 << 20
_HIGH_MODE_BITS = 0o7000  # setuid, setgid, sticky
_PIPE_SIZE = 1 << 20  # the unprivileged maximum on Linux (/proc/sys/fs/pipe-max-size)


async def directory_tar_chunks(local_dir: Path) -> AsyncIterator[bytes]:
    """Yield a tar stream of `local_dir`'s contents (member names relative to it; symlinks kept as links,
    empty directories kept). A file that cannot be read surfaces as the worker's OSError."""

    def write_tar(pipe_w: int) -> None:
        with open(pipe_w, "wb", closefd=False) as sink, \
                tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(os.listdir(local_dir)):
                tar.add(os.path.join(local_dir, name), arcname=name)

    read_end, write_end = _pipe()
    os.set_blocking(read_end, False)
    done = _start_worker(write_tar, write_end)
    try:
        while chunk := await _read_some(read_end, CHUNK):
            yield chunk
        await done
    finally:
        os.close(read_end)  # a producer still writing gets EPIPE and stops
        await _settled(done)


class TarTooLarge(Exception):
    """The files of a tar stream add up to more than the extraction's `max_bytes`."""

    def __init__(self, member: str, total: int, max_bytes: int) -> None:
        super().__init__(f"member {member!r} takes the files' total size to {total} bytes, over max_bytes="
                         f"{max_bytes}")
        self.total = total
        self.max_bytes = max_bytes


class SpecialMemberError(tarfile.FilterError):
    """A tar member that is a device node, FIFO or other special file: never created on this machine."""

    def __init__(self, member: tarfile.TarInfo) -> None:
        super().__init__(f"member {member.name!r} is a device node, FIFO or other special file, which is never "
                         "created on this machine")
        self.tarinfo = member


def _safe_filter(max_bytes: int) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """A tarfile extraction filter for archives from a sandbox (untrusted): tarfile's `data` filter (nothing
    outside the destination, no absolute or escaping links), and on top of it, whatever that filter does
    on this Python version: special files refused, setuid/setgid/sticky bits stripped, owners never
    applied, and the files' declared sizes (sparse files count at their full size) capped at `max_bytes`."""
    total = 0

    def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        nonlocal total
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise SpecialMemberError(member)
        if member.isreg():
            total += member.size
            if total > max_bytes:
                raise TarTooLarge(member.name, total, max_bytes)
        member = tarfile.data_filter(member, dest)
        mode = None if member.mode is None else member.mode & ~_HIGH_MODE_BITS
        return member.replace(mode=mode, uid=None, gid=None, uname=None, gname=None, deep=False)

    return check


async def extract_tar_chunks(chunks: AsyncIterator[bytes], dest: Path, *, max_bytes: int) -> None:
    """Extract a tar stream into the existing directory `dest`, writing at most `max_bytes` of file data.
    Members that would land outside `dest` (absolute paths, `..`, links pointing out) raise
    `tarfile.FilterError`, special files (devices, FIFOs) `SpecialMemberError` (a FilterError), files adding
    up to more than `max_bytes` `TarTooLarge`; setuid/setgid/sticky bits and owners are never applied. The
    caller removes `dest` on failure and counts the raw stream against its own cap."""
    if not hasattr(tarfile, "data_filter"):
        raise RuntimeError("extracting a directory safely needs Python >= 3.11.4 (tarfile's data filter)")
    member_filter = _safe_filter(max_bytes)

    def extract(pipe_r: int) -> None:
        with open(pipe_r, "rb", closefd=False) as source, tarfile.open(fileobj=source, mode="r|") as tar:
            tar.extractall(dest, filter=member_filter)

    read_end, write_end = _pipe()
    os.set_blocking(write_end, False)
    done = _start_worker(extract, read_end)
    write_open = True
    try:
        try:
            async for chunk in chunks:
                await _write_all(write_end, chunk)
        except BrokenPipeError:
            # The worker stopped reading: either the archive ended (trailing padding left) or it failed.
            await _settled(done)
            if done.exception() is None:
                async for _ in chunks:  # drain the rest so the HTTP connection stays reusable
                    pass
        os.close(write_end)
        write_open = False
        await done
    finally:
        if write_open:
            os.close(write_end)  # the worker reads EOF and stops
        await _settled(done)


def place_tree(src: Path, dest: Path) -> None:
    """Move the finished tree `src` to `dest`: a rename when `dest` is absent, otherwise the agent's merge
    (`src`'s entries replace those of the same name, directories are merged recursively)."""
    if not os.path.lexists(dest):
        os.rename(src, dest)
        return
    merge_tree(str(src), str(dest))


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # a bigger pipe means fewer loop wake-ups
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    return read_end, write_end


def _start_worker(fn: Callable[[int], None], fd: int) -> asyncio.Future:
    """Run `fn(fd)` in a daemon thread that closes `fd` when done; the future settles with its outcome."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if not done.done():
            done.set_exception(exc) if exc is not None else done.set_result(None)

    def target() -> None:
        outcome: BaseException | None = None
        try:
            fn(fd)
        except BaseException as exc:  # handed to the event loop side, which raises it
            outcome = exc
        finally:
            os.close(fd)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting any more
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=target, name="orchard-tar-stream", daemon=True).start()
    return done


async def _settled(done: asyncio.Future) -> None:
    """Wait for the worker to finish, without raising its error (the caller decides what to raise)."""
    await asyncio.wait([done])
    if not done.cancelled():
        done.exception()  # mark it retrieved


async def _read_some(fd: int, n: int) -> bytes:
    while True:
        try:
            return os.read(fd, n)
        except BlockingIOError:
            await _fd_ready(fd, writable=False)


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await _fd_ready(fd, writable=True)


async def _fd_ready(fd: int, *, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    add(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        remove(fd)
