"""Applying an image's layers, lowest first, onto a root directory, never writing outside it.

How a layer (a tar stream) is applied, as the OCI image spec's changeset rules say:
- `DIR/.wh.NAME` removes NAME (file or whole tree) left by lower layers; `DIR/.wh..wh..opq` empties DIR of
  everything lower layers put there (what this layer adds stays); other `.wh..wh.*` entries are
  bookkeeping of aufs and ignored;
- a member replaces what is at its path, except a directory over a directory, which merges;
- ownership (mapped by the `IdMap`: image root becomes the sandbox's root), modes with setuid/setgid/
  sticky, mtimes, symlinks as they are, hard links, FIFOs; device nodes are skipped (a sandbox gets a
  fresh /dev); of the extended attributes only `security.capability` and `user.*` are kept (`trusted.*`
  could steer the overlay the sandbox mounts over the root, `security.selinux` means nothing here).

Escapes are refused, not repaired: a member named absolutely or with `..`, or whose path runs through a
symlink (layers are file-system diffs and name real paths; only a crafted archive writes through one),
or a hard link to something outside. Every path is walked one component at a time from a directory file
descriptor with O_NOFOLLOW, and each file is created relative to its parent's descriptor, so a symlink
placed by an earlier member is never followed, whatever it points to."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from dataclasses import dataclass, field
from typing import IO

from orchard.core.errors import BackendError, InvalidRequest
from orchard.sandbox.images.models import IdMap

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
KEPT_XATTRS = ("security.capability",)
KEPT_XATTR_PREFIXES = ("user.",)
XATTR_PAX_PREFIX = "SCHILY.xattr."
CHUNK = 1 << 20
MAX_CACHED_DIRS = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeMember(InvalidRequest):
    """A layer member that would write outside the root."""


@dataclass
class LayerStats:
    files: int = 0
    skipped: list[str] = field(default_factory=list)  # device nodes, xattrs that could not be set


class RootWriter:
    """Writes layers into `root_fd`'s directory. Keeps parent directory descriptors across members (a
    layer lists a directory's entries together) and drops them all whenever anything is removed, so a
    descriptor never outlives the directory its path named."""

    def __init__(self, root_fd: int, ids: IdMap | None) -> None:
        self.root_fd = root_fd
        self.ids = ids
        self._dirs: dict[tuple[str, ...], int] = {}
        self._retired: list[int] = []  # forgotten, but maybe still in use by the member at hand
        # Directories' modes and times, applied by finish() after the last layer: a read-only directory
        # (0555) stays writable for an unprivileged importer's later layers, and a directory's mtime is
        # not bumped by what later layers add to it.
        self._directories: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
        self.stats = LayerStats()

    def close(self) -> None:
        self._forget()
        self._release()

    def _forget(self) -> None:
        self._retired.extend(self._dirs.values())
        self._dirs.clear()

    def _release(self) -> None:
        """Between members: close what was forgotten, and bound how many descriptors stay open."""
        if len(self._dirs) > MAX_CACHED_DIRS:
            self._forget()
        for fd in self._retired:
            os.close(fd)
        self._retired.clear()

    # ---- one layer -------------------------------------------------------------------------------------

    def apply(self, stream: IO[bytes], what: str) -> None:
        """Apply the layer tar read from `stream` (already decompressed)."""
        added: set[tuple[str, ...]] = set()  # paths this layer made: an opaque dir keeps them
        directories = self._directories
        with tarfile.open(fileobj=stream, mode="r|") as layer:  # type: ignore[call-overload]
            for member in layer:
                self._release()
                parts = member_parts(member.name, what)
                if parts and parts[-1].startswith(WHITEOUT):
                    self._whiteout(parts, added, what)
                    continue
                added.update(parts[:i] for i in range(1, len(parts) + 1))
                self._member(layer, member, parts, what, directories)
        self.close()

    def finish(self) -> None:
        """After the last layer: every directory's mode and times, the last layer's that listed it."""
        done: set[tuple[str, ...]] = set()
        for parts, member in reversed(self._directories):  # deepest last-listed first; the latest wins
            if parts not in done:
                done.add(parts)
                self._finish_directory(parts, member)
        self._directories.clear()
        self.close()

    def _member(self, layer: tarfile.TarFile, member: tarfile.TarInfo, parts: tuple[str, ...], what: str,
                directories: list) -> None:
        if not parts:  # the root itself ("./")
            if not member.isdir():
                raise UnsafeMember(f"{what}: member {member.name!r} would replace the image's root with a "
                                   "non-directory. The archive is crafted or corrupt")
            directories.append((parts, member))
            return
        parent = self._dir(parts[:-1], create=True, what=what)
        name = parts[-1]
        if member.isdir():
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    self._remove(parent, name)
                    raise FileNotFoundError
            except FileNotFoundError:
                os.mkdir(name, 0o700, dir_fd=parent)
            self._own(parent, name, member)
            directories.append((parts, member))
        elif member.isreg():
            self._file(layer, member, parent, name)
        elif member.issym():
            self._replace(parent, name, lambda: os.symlink(member.linkname, name, dir_fd=parent))
            self._own(parent, name, member)
            os.utime(name, ns=(member.mtime * 10**9,) * 2, dir_fd=parent, follow_symlinks=False)
        elif member.islnk():
            target = member_parts(member.linkname, what)
            if not target:
                raise UnsafeMember(f"{what}: {member.name} is a hard link to the root directory")
            try:
                source = self._dir(target[:-1], create=False, what=what)
                if stat.S_ISDIR(os.stat(target[-1], dir_fd=source, follow_symlinks=False).st_mode):
                    raise InvalidRequest(f"{what}: {member.name} is a hard link to a directory")
            except FileNotFoundError:
                raise InvalidRequest(f"{what}: {member.name} is a hard link to {member.linkname}, which no "
                                     "earlier member made: the layer is corrupt") from None
            if (parent, name) != (source, target[-1]):
                self._replace(parent, name, lambda: os.link(target[-1], name, src_dir_fd=source,
                                                            dst_dir_fd=parent, follow_symlinks=False))
        elif member.isfifo():
            self._replace(parent, name, lambda: os.mkfifo(name, 0o600, dir_fd=parent))
            self._own(parent, name, member)
            self._mode_and_time(parent, name, member)
        else:  # character and block devices: the sandbox has its own /dev
            self.stats.skipped.append(f"device {member.name}")

    def _file(self, layer: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = self._replace(parent, name, lambda: os.open(name, flags, 0o600, dir_fd=parent))
        try:
            source = layer.extractfile(member)
            assert source is not None
            remaining = member.size
            while remaining > 0:
                chunk = source.read(min(CHUNK, remaining))
                if not chunk:
                    raise tarfile.ReadError(f"unexpected end of data in {member.name}")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                remaining -= len(chunk)
            if self.ids is not None:
                os.fchown(fd, self.ids.host(member.uid), self.ids.host(member.gid))
            os.fchmod(fd, member.mode & 0o7777)  # after chown, which clears setuid
            self._xattrs(fd, member)
            os.utime(fd, ns=(member.mtime * 10**9,) * 2)
        finally:
            os.close(fd)
        self.stats.files += 1

    def _whiteout(self, parts: tuple[str, ...], added: set[tuple[str, ...]], what: str) -> None:
        directory, marker = parts[:-1], parts[-1]
        try:
            parent = self._dir(directory, create=False, what=what)
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing below to hide
        if marker == OPAQUE:
            for entry in os.listdir(parent):
                if directory + (entry,) not in added:
                    self._remove(parent, entry)
        elif not marker.startswith(WHITEOUT + WHITEOUT):
            name = marker[len(WHITEOUT):]
            if name in ("", ".", ".."):
                return
            try:
                self._remove(parent, name)
            except FileNotFoundError:
                pass

    # ---- paths -----------------------------------------------------------------------------------------

    def _dir(self, parts: tuple[str, ...], *, create: bool, what: str) -> int:
        """A descriptor of directory `parts` under the root, reached without following any symlink."""
        if not parts:
            return self.root_fd
        cached = self._dirs.get(parts)
        if cached is not None:
            return cached
        parent = self._dir(parts[:-1], create=create, what=what)
        name = parts[-1]
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o755, dir_fd=parent)  # a parent the layer did not list: root's, 0755
            if self.ids is not None:
                os.chown(name, self.ids.host(0), self.ids.host(0), dir_fd=parent, follow_symlinks=False)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            where = "/".join(parts)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafeMember(f"{what}: a member's path goes through {where}, a symlink an earlier member "
                                   "made; Orchard never writes through a symlink (it could lead outside the "
                                   "image's root). The archive is crafted or corrupt") from None
            raise InvalidRequest(f"{what}: a member's path goes through {where}, which is not a directory: "
                                 "the layer is corrupt") from None
        self._dirs[parts] = fd
        return fd

    def _replace(self, parent: int, name: str, make):
        """`make()`, first removing whatever is at `name` when it is in the way."""
        try:
            return make()
        except FileExistsError:
            self._remove(parent, name)
            return make()

    def _remove(self, parent: int, name: str) -> None:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        self._forget()  # a cached descriptor may be of this tree
        if stat.S_ISDIR(st.st_mode):
            _rmtree_at(parent, name)
        else:
            os.unlink(name, dir_fd=parent)

    # ---- metadata --------------------------------------------------------------------------------------

    def _own(self, parent: int, name: str, member: tarfile.TarInfo) -> None:
        if self.ids is not None:
            os.chown(name, self.ids.host(member.uid), self.ids.host(member.gid), dir_fd=parent,
                     follow_symlinks=False)

    def _mode_and_time(self, parent: int, name: str, member: tarfile.TarInfo) -> None:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        try:
            os.fchmod(fd, member.mode & 0o7777)
            os.utime(fd, ns=(member.mtime * 10**9,) * 2)
        finally:
            os.close(fd)

    def _finish_directory(self, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        try:
            fd = self._dir(parts, create=False, what="")
        except (OSError, InvalidRequest):
            return  # removed or replaced later in the layer
        if not parts and self.ids is not None:
            os.fchown(fd, self.ids.host(member.uid), self.ids.host(member.gid))
        os.fchmod(fd, member.mode & 0o7777)
        self._xattrs(fd, member)
        os.utime(fd, ns=(member.mtime * 10**9,) * 2)

    def _xattrs(self, fd: int, member: tarfile.TarInfo) -> None:
        for key, value in xattrs(member):
            try:
                os.setxattr(fd, key, value)
            except OSError as e:  # e.g. security.* unprivileged, user.* on a file system without them
                self.stats.skipped.append(f"xattr {key} of {member.name} ({e.strerror})")


def member_parts(name: str, what: str) -> tuple[str, ...]:
    """A member's path as components under the root; UnsafeMember for an absolute path or `..`."""
    if name.startswith("/") or "\x00" in name:
        raise UnsafeMember(f"{what}: member {name!r} has an absolute path; image layers name paths relative "
                           "to the root. The archive is crafted or corrupt")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeMember(f"{what}: member {name!r} has '..' in its path and would be written outside the "
                           "image's root. The archive is crafted or corrupt")
    return parts


def xattrs(member: tarfile.TarInfo) -> list[tuple[str, bytes]]:
    kept = []
    for key, value in member.pax_headers.items():
        if not key.startswith(XATTR_PAX_PREFIX):
            continue
        name = key[len(XATTR_PAX_PREFIX):]
        if name in KEPT_XATTRS or name.startswith(KEPT_XATTR_PREFIXES):
            kept.append((name, value.encode("utf-8", "surrogateescape")))
    return kept


def _rmtree_at(parent: int, name: str) -> None:
    """Remove the tree `name` under `parent` without following symlinks."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _rmtree_at(fd, entry)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def write_error(e: OSError, what: str) -> BackendError:
    return BackendError(f"could not write {what} into the image store: {e}; check the disk space and "
                        "permissions of ORCHARD_HOME")
