"""The image store: `<root>/<alg>-<hex>/` per imported image (its `rootfs/` and `image.json`), and
`<root>/index.json` mapping names to digests.

An import unpacks into a temporary directory beside the images and renames it into place only when every
layer was applied and checked, so a half-unpacked image is never used and a failure leaves nothing.
Importers of the same image wait on one lock per digest (the second finds it done); the index is read,
changed and atomically rewritten under a lock of its own, so concurrent imports never lose a name."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from orchard.core.atomic_write import atomic_write_text
from orchard.core.errors import InvalidRequest, OrchardError
from orchard.sandbox.images.archive import ArchiveImage, read_image
from orchard.sandbox.images.blobs import READ_ERRORS, ArchiveFiles, LayerPipe, parse_digest
from orchard.sandbox.images.models import IdMap, ImageIndex, ImageRecord
from orchard.sandbox.images.refs import name_variants, normal_name, strip_oci_prefix
from orchard.sandbox.images.unpack import RootWriter, write_error

INDEX_NAME = "index.json"
RECORD_NAME = "image.json"
ROOTFS_NAME = "rootfs"
SHORT_DIGEST = 12  # the fewest hex digits a digest prefix may have (like docker's short ids)

Progress = Callable[[int, int, int], None]  # (layer number from 1, layers, bytes read so far of this layer)


class ImageStore:
    """Imported images under `root` (default $ORCHARD_HOME/images)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---- reading ---------------------------------------------------------------------------------------

    def index(self) -> ImageIndex:
        try:
            return ImageIndex.model_validate_json((self.root / INDEX_NAME).read_bytes())
        except FileNotFoundError:
            return ImageIndex()

    def records(self) -> list[ImageRecord]:
        found = []
        for path in sorted(self.root.glob(f"*/{RECORD_NAME}")) if self.root.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                found.append(ImageRecord.model_validate_json(path.read_bytes()))
        return found

    def resolve(self, ref: str) -> ImageRecord:
        """The image a reference names: `oci:` optional, then a name, `sha256:<hex>` or a unique prefix of at
        least 12 hex digits. InvalidRequest when nothing imported matches."""
        ref = strip_oci_prefix(ref.strip())
        digest = self._digest_of(ref)
        record = self._record(digest) if digest else None
        if record is None:
            raise InvalidRequest(f"image {ref!r} is not imported here: import it first with `orchard image import "
                                 "FILE` (an OCI layout, or a `docker save` / `podman save` archive); "
                                 "`orchard image list` shows what is imported")
        return record

    def rootfs(self, record: ImageRecord) -> Path:
        return self._dir(record.digest) / ROOTFS_NAME

    def _digest_of(self, ref: str) -> str | None:
        if ref.startswith(("sha256:", "sha512:")) or re.fullmatch(r"[0-9a-f]{12,128}", ref):
            value = ref.partition(":")[2] if ":" in ref else ref
            matches = [r.digest for r in self.records() if r.digest.partition(":")[2].startswith(value)]
            if len(matches) > 1 and len(value) >= SHORT_DIGEST:
                raise InvalidRequest(f"{ref!r} names {len(matches)} imported images; give more of the digest")
            return matches[0] if matches and len(value) >= SHORT_DIGEST else None
        try:
            names = self.index().names
            return next((names[n] for n in name_variants(normal_name(ref)) if n in names), None)
        except InvalidRequest:
            return None

    def _record(self, digest: str) -> ImageRecord | None:
        try:
            return ImageRecord.model_validate_json((self._dir(digest) / RECORD_NAME).read_bytes())
        except (OSError, ValueError):
            return None

    def _dir(self, digest: str) -> Path:
        algorithm, value = parse_digest(digest, "an image")
        return self.root / f"{algorithm}-{value}"

    # ---- import ----------------------------------------------------------------------------------------

    def import_archive(self, source: Path, *, name: str | None = None, ids: IdMap | None = None,
                       progress: Progress | None = None) -> tuple[ImageRecord, list[str]]:
        """Unpack the image in `source` (unless its digest is here already) and point its names at it: the
        archive's, or only `name` when given. Returns the record and the names now pointing at it."""
        names = [normal_name(name)] if name else []
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with ArchiveFiles(Path(source)) as files:
            image = read_image(files)
            if not name:
                names = sorted({normal_name(n) for n in image.names if _valid(n)})
            with self._locked(f".{self._dir(image.digest).name}.lock"):
                record = self._record(image.digest)
                if record is None or record.ids != ids:
                    record = self._unpack(files, image, ids, progress)
        if names:
            self._update_names(lambda index: index.names.update({n: record.digest for n in names}))
        return record, names

    def _unpack(self, files: ArchiveFiles, image: ArchiveImage, ids: IdMap | None,
                progress: Progress | None) -> ImageRecord:
        final = self._dir(image.digest)
        for stale in self.root.glob(f".import-{final.name}-*"):  # a crashed import's: we hold its lock now
            _remove_tree(stale, self.root)
        temporary = Path(tempfile.mkdtemp(prefix=f".import-{final.name}-", dir=self.root))
        try:
            rootfs = temporary / ROOTFS_NAME
            rootfs.mkdir(mode=0o755)
            if ids is not None:
                os.chown(rootfs, ids.host(0), ids.host(0))
            size = 0
            root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            writer = RootWriter(root_fd, ids)
            try:
                for number, layer in enumerate(image.layers, 1):
                    size += self._apply_layer(files, layer, writer, number, len(image.layers), progress)
                writer.finish()
            finally:
                writer.close()
                os.close(root_fd)
            record = ImageRecord(digest=image.digest, format=image.format, layers=[l.digest for l in image.layers],
                                 size_bytes=size, config=image.config, ids=ids, imported_at=time.time(),
                                 skipped=writer.stats.skipped[:20])
            atomic_write_text(temporary / RECORD_NAME, record.model_dump_json(indent=1), durable=False)
            os.chmod(temporary, 0o755)
            if final.exists():  # an import under other ids: replaced (no sandbox may run on it meanwhile)
                _remove_tree(final, self.root)
            os.rename(temporary, final)
            temporary = None
            return record
        except OSError as e:
            raise write_error(e, f"image {image.digest}") from None
        finally:
            if temporary is not None:
                _remove_tree(temporary, self.root)

    def _apply_layer(self, files: ArchiveFiles, layer, writer: RootWriter, number: int, count: int,
                     progress: Progress | None) -> int:
        what = f"{files.source}: layer {number} of {count} ({layer.digest[:19]})"
        report = (lambda n: progress(number, count, n)) if progress else None
        with files.open(layer.path) as raw, LayerPipe(raw, layer.digest, what, uncompressed=layer.uncompressed,
                                                      counted=report, declared_size=layer.declared_size) as pipe:
            try:
                writer.apply(pipe.file, what)
                pipe.finish()
            except READ_ERRORS as e:
                if pipe.error is not None and not isinstance(pipe.error, READ_ERRORS):
                    raise pipe.error from None  # what made the tar end early: a digest, zstd refused
                raise InvalidRequest(f"{what} cannot be read ({pipe.error or e}): the archive is truncated or "
                                     "corrupt; save the image again") from None
            return pipe.bytes_read

    # ---- names and removal -----------------------------------------------------------------------------

    def remove(self, ref: str) -> list[str]:
        """Remove a name (the image too when no other name points at it) or, by digest, the image and every
        name of it. Returns what was removed."""
        ref = strip_oci_prefix(ref.strip())
        record = self.resolve(ref)
        known = self.index().names
        name = next((n for n in name_variants(normal_name(ref)) if n in known), None) if _valid(ref) else None
        by_name = name is not None
        removed: list[str] = []

        def change(index: ImageIndex) -> None:
            drop = [name] if by_name else [n for n, d in index.names.items() if d == record.digest]
            for n in drop:
                index.names.pop(n, None)  # type: ignore[arg-type]
            removed.extend(n for n in drop if n)

        index = self._update_names(change)
        if record.digest not in index.names.values():
            with self._locked(f".{self._dir(record.digest).name}.lock"):
                _remove_tree(self._dir(record.digest), self.root)
            removed.append(record.digest)
        return removed

    def _update_names(self, change: Callable[[ImageIndex], None]) -> ImageIndex:
        with self._locked(".index.lock"):
            index = self.index()
            change(index)
            atomic_write_text(self.root / INDEX_NAME, index.model_dump_json(indent=1))
            return index

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.root / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _valid(name: str) -> bool:
    try:
        normal_name(name)
        return True
    except OrchardError:
        return False


def _remove_tree(path: Path, root: Path) -> None:
    """Remove `path` (under `root`): renamed aside first, so that no reader sees half of it."""
    if not path.exists():
        return
    aside = Path(tempfile.mkdtemp(prefix=".removing-", dir=root))
    os.rename(path, aside / "tree")

    def writable(function, failed: str, _exc) -> None:
        # An image's read-only directories (0555 and the like) stop an unprivileged owner's removal.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            function(failed)

    shutil.rmtree(aside, onerror=writable)
