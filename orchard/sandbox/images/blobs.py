"""An archive's files, read the same whether it is a directory or a tar (plain or compressed), with every
content-addressed blob checked against its digest, and layers decompressed by their magic bytes.

Every way an archive can be broken (missing file, truncated tar, bad gzip, digest mismatch) surfaces as
`InvalidRequest` naming the archive and the part, since the archive is the user's input."""

from __future__ import annotations

import gzip
import hashlib
import os
import posixpath
import tarfile
import threading
import zlib
from pathlib import Path
from typing import IO, BinaryIO, Callable, Mapping

from orchard.core.errors import InvalidRequest

DIGEST_ALGORITHMS = {"sha256": 64, "sha512": 128}
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_JSON_BYTES = 16 << 20  # an index, manifest or config: JSON, never this big
# How far a layer may inflate: a gzip stream of 2 MB can hold 2 GiB of zeros, all of it written to the host
# by an import. Real layers inflate 2-5 times; past this many times what the manifest declares (or, without
# a declared size, what was read so far), plus a small allowance, the import stops and keeps nothing.
MAX_EXPANSION_ENV = "ORCHARD_IMAGE_MAX_EXPANSION"
DEFAULT_MAX_EXPANSION = 100
EXPANSION_ALLOWANCE = 64 << 20
# What reading a broken archive or layer raises (tarfile, gzip, zlib, zstandard): all mean "corrupt".
READ_ERRORS: tuple[type[BaseException], ...] = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile,
                                                 UnicodeDecodeError)
try:  # optional: zstd layers are rare (podman can write them); without the module they are refused
    import zstandard
    READ_ERRORS += (zstandard.ZstdError,)
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None


def parse_digest(digest: object, what: str) -> tuple[str, str]:
    """('sha256', hex) of an OCI digest string; InvalidRequest when it is not one we can check."""
    algorithm, _, value = str(digest).partition(":")
    if (algorithm not in DIGEST_ALGORITHMS or len(value) != DIGEST_ALGORITHMS[algorithm]
            or value.strip("0123456789abcdef")):
        raise InvalidRequest(f"{what} has digest {str(digest)[:100]!r}, which is not a sha256 or sha512 digest")
    return algorithm, value


def blob_path(digest: str) -> str:
    algorithm, value = parse_digest(digest, "a blob")
    return f"blobs/{algorithm}/{value}"


class ArchiveFiles:
    """The files of an image archive by their path inside it (e.g. `index.json`, `blobs/sha256/...`)."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        if source.is_dir():
            return
        if not source.is_file():
            raise InvalidRequest(f"{source} does not exist: give an OCI image layout (a directory or a tar of "
                                 "one) or a `docker save` / `podman save` archive")
        try:
            # Seekable random access to members; a compressed outer tar works too, only slower to seek.
            self._tar = tarfile.open(source, "r:*")
            for member in self._tar.getmembers():
                self._members[_normal(member.name)] = member
        except READ_ERRORS as e:
            self.close()
            raise InvalidRequest(f"{source} is not a readable tar archive ({e}): it is truncated or corrupt, or "
                                 "not an image archive; save the image again") from None

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None

    def __enter__(self) -> "ArchiveFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exists(self, path: str) -> bool:
        if self._tar is None:
            return (self.source / _inside(path)).is_file()
        return path in self._members

    def open(self, path: str) -> BinaryIO:
        """The file at `path` (a regular file, or a link to one inside the archive)."""
        if self._tar is None:
            full = self.source / _inside(path)
            # Any symlink in the layout must stay inside it (docker's saves link duplicate layers).
            if not full.resolve().is_relative_to(self.source.resolve()) or not full.is_file():
                raise InvalidRequest(f"{self.source} lacks {path} (or it leads outside the layout): the image "
                                     "layout is incomplete; save the image again")
            return open(full, "rb")
        member = self._members.get(_normal(path))
        try:
            handle = self._tar.extractfile(member) if member is not None else None
        except (KeyError, *READ_ERRORS):
            handle = None
        if handle is None:
            raise InvalidRequest(f"{self.source} lacks {path}: the archive is incomplete; save the image again")
        return handle  # type: ignore[return-value]

    def read_json_bytes(self, path: str) -> bytes:
        with self.open(path) as f:
            try:
                data = f.read(MAX_JSON_BYTES + 1)
            except READ_ERRORS as e:
                raise InvalidRequest(f"{self.source}: {path} cannot be read ({e}); the archive is truncated or "
                                     "corrupt") from None
        if len(data) > MAX_JSON_BYTES:
            raise InvalidRequest(f"{self.source}: {path} is over {MAX_JSON_BYTES >> 20} MiB, too big for image "
                                 "metadata")
        return data

    def read_blob(self, digest: str, what: str) -> bytes:
        """A JSON blob by digest, checked."""
        data = self.read_json_bytes(blob_path(digest))
        check_bytes(data, digest, f"{self.source}: the {what}")
        return data


def check_bytes(data: bytes, digest: str, what: str) -> None:
    algorithm, value = parse_digest(digest, what)
    if hashlib.new(algorithm, data).hexdigest() != value:
        raise InvalidRequest(f"{what} does not match its digest {digest}: the archive is corrupt; save the "
                             "image again")


class HashingReader:
    """Reads through `raw`, hashing what passes; `verify()` reads the rest and checks the digest."""

    def __init__(self, raw: IO[bytes], digest: str, what: str) -> None:
        self.raw = raw
        self.digest = digest
        self.what = what
        algorithm, self._expected = parse_digest(digest, what)
        self._hash = hashlib.new(algorithm)
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self._hash.update(data)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:  # gzip's reader prefers it
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def verify(self) -> None:
        while self.read(1 << 20):
            pass
        if self._hash.hexdigest() != self._expected:
            raise InvalidRequest(f"{self.what} does not match its digest {self.digest}: the archive is corrupt; "
                                 "save the image again")


class _Peeked:
    """A stream with its first bytes read ahead (to sniff the compression) and given back."""

    def __init__(self, raw: IO[bytes], head: bytes) -> None:
        self.raw, self.head = raw, head

    def read(self, size: int = -1) -> bytes:
        if self.head:
            if size < 0:
                data, self.head = self.head + self.raw.read(), b""
                return data
            data, self.head = self.head[:size], self.head[size:]
            return data if len(data) == size else data + self.raw.read(size - len(data))
        return self.raw.read(size)

    def readable(self) -> bool:
        return True


def decompressed(raw: IO[bytes], what: str) -> IO[bytes]:
    """The layer tar inside `raw`, whichever of plain, gzip or zstd it is (by magic, not media type:
    docker archives name none, and some registries' media types lie)."""
    head = raw.read(4)
    stream = _Peeked(raw, head)
    if head.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[arg-type]
    if head.startswith(ZSTD_MAGIC):
        if zstandard is None:
            raise InvalidRequest(f"{what} is zstd-compressed, and the Python module zstandard is not installed: "
                                 "`pip install zstandard`, or save the image with gzip layers")
        return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return stream  # type: ignore[return-value]


class LayerPipe:
    """A layer's tar, decompressed and digest-checked by a thread of its own while the caller unpacks it:
    zlib, zstd and hashlib release the GIL, so on two cores reading overlaps writing, as `tar -xz` overlaps
    its gzip child. `digest` is checked on the bytes as stored, or with `uncompressed` on the tar inside
    (a docker archive's diff id). Use as a context manager around reading `file`; `finish()` reads what the
    tar reader left (the end-of-archive padding) and raises what the thread found: a digest mismatch, a
    corrupt stream. Leaving early (an unsafe member) closes the pipe, which stops the thread."""

    def __init__(self, raw: IO[bytes], digest: str, what: str, *, uncompressed: bool,
                 counted: Callable[[int], None] | None = None, declared_size: int | None = None,
                 max_expansion: int | None = None) -> None:
        self.raw, self.digest, self.what, self.uncompressed, self.counted = raw, digest, what, uncompressed, counted
        self.declared_size = declared_size
        self.max_expansion = max_expansion_from_env() if max_expansion is None else max_expansion
        self.error: BaseException | None = None
        self.bytes_read = 0  # as stored (compressed)
        self.bytes_unpacked = 0  # the tar inside
        read_end, self._write_end = os.pipe()
        self.file = os.fdopen(read_end, "rb", buffering=1 << 20)
        self._thread = threading.Thread(target=self._pump, name="orchard-layer-reader", daemon=True)

    def __enter__(self) -> "LayerPipe":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()  # a thread still writing gets EPIPE and ends
        self._thread.join()

    def finish(self) -> None:
        while self.file.read(1 << 20):
            pass
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _pump(self) -> None:
        try:
            stored = _Counting(self.raw, self)
            checked_stored = None if self.uncompressed else HashingReader(stored, self.digest, self.what)
            stream = decompressed(checked_stored or stored, self.what)  # type: ignore[arg-type]
            checked_tar = HashingReader(stream, self.digest, self.what) if self.uncompressed else None
            source = checked_tar or stream
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                self.bytes_unpacked += len(chunk)
                self._check_expansion()
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self._write_end, view):]
            (checked_tar or checked_stored).verify()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # the reader left early; it raises its own error
        except BaseException as e:  # handed to the unpacking thread by finish()
            self.error = e
        finally:
            os.close(self._write_end)


    def _check_expansion(self) -> None:
        """Refuse the layer once its tar is past `max_expansion` times its stored size (the declared one, or
        what was read so far) plus the allowance: before those bytes reach the unpacking thread."""
        basis = max(self.declared_size or 0, self.bytes_read)
        cap = basis * self.max_expansion + EXPANSION_ALLOWANCE
        if self.bytes_unpacked > cap:
            raise InvalidRequest(
                f"{self.what} inflates to more than {self.bytes_unpacked >> 20} MiB from {basis} bytes as stored, "
                f"over {self.max_expansion} times that plus {EXPANSION_ALLOWANCE >> 20} MiB: a decompression bomb, "
                f"so nothing of the image was kept. If the image is genuine (a layer of huge sparse or zero files), "
                f"raise {MAX_EXPANSION_ENV} (now {self.max_expansion}) for its import")

    def check_declared(self) -> None:
        if self.declared_size is not None and self.bytes_read > self.declared_size:
            raise InvalidRequest(f"{self.what} holds more than the {self.declared_size} bytes its manifest "
                                 "declares: the archive is corrupt or crafted; nothing of the image was kept")


def max_expansion_from_env(environ: Mapping[str, str] | None = None) -> int:
    text = (os.environ if environ is None else environ).get(MAX_EXPANSION_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_EXPANSION
    if not text.isdigit() or int(text) < 1:
        raise InvalidRequest(f"{MAX_EXPANSION_ENV}={text[:40]!r} is not a whole number of at least 1: how many "
                             f"times its stored size a layer may inflate (default {DEFAULT_MAX_EXPANSION})")
    return int(text)


class _Counting:
    def __init__(self, raw: IO[bytes], pipe: LayerPipe) -> None:
        self.raw, self.pipe, self._told = raw, pipe, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.pipe.bytes_read += len(data)
        self.pipe.check_declared()
        if self.pipe.counted and (self.pipe.bytes_read - self._told >= 4 << 20 or not data):
            self._told = self.pipe.bytes_read
            self.pipe.counted(self.pipe.bytes_read)
        return data

    def readable(self) -> bool:
        return True


def _normal(name: str) -> str:
    name = posixpath.normpath(name.lstrip("/")) if name not in ("", ".", "./") else "."
    return name


def _inside(path: str) -> str:
    normal = _normal(path)
    if normal.startswith("../") or normal == "..":
        raise InvalidRequest(f"the archive names {path!r}, a path outside itself")
    return normal


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
