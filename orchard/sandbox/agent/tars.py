"""`/tar`: directories as tar streams. GET streams a tar of a directory's contents as it is read; PUT
extracts a streamed tar into a temp directory beside the target, refusing anything that could land outside
it (absolute names, `..`, links pointing out, devices), and only then moves the result into place — a
refused or broken archive leaves the target untouched. Each member's place is checked before anything is
created for it: a member that would pass through a symlink pointing outside the staging directory (one made
earlier in the same archive) is refused before a single directory is made through that link. The staging
directory stays private (0700) until it is moved into place.

tarfile, shutil and tempfile are imported on the first tar request, not at the start of every sandbox
(together they cost several milliseconds there)."""

from __future__ import annotations

import os

from .wire import CHUNK, bad_request, not_found

TAR_BUFFER = 1 << 18  # size of each chunk of a tar download


def handle_download(req):
    root = req.context.resolve(req.param("path", required=True))
    if not os.path.exists(root):
        raise not_found("%s does not exist in the sandbox; check the path" % root)
    if not os.path.isdir(root):
        raise bad_request("%s is not a directory; use GET /files to read a file" % root)
    names = sorted(os.listdir(root))
    import tarfile

    writer = req.start_chunked("application/x-tar")
    # An error after this point (a file unreadable mid-way) propagates: the server then closes the
    # connection without the final chunk, so the client sees a broken download, never a short "success".
    with tarfile.open(fileobj=writer, mode="w|", bufsize=TAR_BUFFER, format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            tar.add(os.path.join(root, name), arcname=name)  # symlinks stay symlinks; sockets are skipped
    writer.close()


def handle_upload(req) -> dict:
    root = req.context.resolve(req.param("path", required=True))
    if os.path.lexists(root) and not os.path.isdir(root):
        raise bad_request("%s exists and is not a directory; pick a directory path to extract into" % root)
    import shutil
    import tempfile

    body = req.body()
    exists = os.path.isdir(root)
    # Stage on the same filesystem as the result: inside an existing DIR (its parent may be read-only,
    # e.g. a workdir mounted under a read-only root), else beside it, where DIR itself will be created.
    parent = root if exists else os.path.dirname(root)
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise bad_request("cannot create %s: a parent of it is a file, not a directory" % root)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".orchard-tar-")
    try:
        count = _extract(body, tmp)
        if exists:
            merge_tree(tmp, root)
        else:
            os.chmod(tmp, 0o777 & ~req.context.umask)  # mkdtemp made it 0700; now it becomes the target
            os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"path": root, "files": count}


def _refuse(member_name: str, why: str):
    return bad_request("refused the tar archive: member %r %s; nothing was written" % (member_name, why))


def _safe_name(name: str, member_name: str):
    """The member's path relative to the archive root, or None for the root itself."""
    if name.startswith("/"):
        raise _refuse(member_name, "has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(member_name, "contains '..'")
    if any("\x00" in p for p in parts):
        raise _refuse(member_name, "contains a NUL byte")
    return "/".join(parts) or None


def _inside(root: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def _make_dirs(tmp: str, path: str, member_name: str):
    """Create `path` and its missing parents inside the staging directory `tmp`, one level at a time, each
    checked to resolve inside `tmp` before it is made: a link planted by an earlier member is never
    followed out, not even to create an empty directory."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for level in reversed(missing):
        if not _inside(tmp, level):
            raise _refuse(member_name, "is reached through a symlink pointing outside the target")
        if os.path.lexists(level):  # a dangling link or a file where a directory has to be
            raise _refuse(member_name, "needs a directory where the archive has put a file or a link")
        os.mkdir(level)


def _clear(target: str):
    """Remove what a later member replaces, so nothing is ever written through an existing symlink."""
    import shutil

    if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
        os.unlink(target)
    elif os.path.isdir(target):
        shutil.rmtree(target)


def _extract(body, tmp: str) -> int:
    import shutil
    import tarfile

    tmp = os.path.realpath(tmp)
    count = 0
    dirs = []
    links = []
    try:
        tar = tarfile.open(fileobj=body, mode="r|*", bufsize=CHUNK)
    except tarfile.TarError as exc:
        raise bad_request("the body is not a tar stream (%s); send an uncompressed or gzip/bz2/xz tar" % exc)
    try:
        for member in tar:
            name = _safe_name(member.name, member.name)
            if name is None:
                continue
            target = os.path.join(tmp, name)
            # Before anything is created for this member: where its parent really is, following the links
            # earlier members made (realpath resolves the part that exists; nothing is created here).
            if not _inside(tmp, os.path.dirname(target)):
                raise _refuse(member.name, "is reached through a symlink pointing outside the target")
            if member.isdir():
                if os.path.lexists(target) and (os.path.islink(target) or not os.path.isdir(target)):
                    os.unlink(target)  # the link itself (inside the staging directory), never its target
                _make_dirs(tmp, target, member.name)
                dirs.append((target, member))
                continue
            _make_dirs(tmp, os.path.dirname(target), member.name)
            _clear(target)
            if member.isfile():
                source = tar.extractfile(member)
                with open(target, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                os.chmod(target, member.mode & 0o1777)
                os.utime(target, (member.mtime, member.mtime))
            elif member.issym():
                if member.linkname.startswith("/"):
                    raise _refuse(member.name, "is a symlink to an absolute path (%r)" % member.linkname)
                if not _inside(tmp, os.path.join(os.path.dirname(target), member.linkname)):
                    raise _refuse(member.name, "is a symlink pointing outside the target (%r)"
                                  % member.linkname)
                os.symlink(member.linkname, target)
                links.append((target, member))
            elif member.islnk():
                source = os.path.join(tmp, _safe_name(member.linkname, member.name) or "")
                if not _inside(tmp, source) or not os.path.isfile(source):
                    raise _refuse(member.name, "is a hard link to %r, which is not a file earlier in the "
                                               "archive" % member.linkname)
                os.link(os.path.realpath(source), target)
            else:
                raise _refuse(member.name, "is a device, FIFO or other special file")
            count += 1
    except (tarfile.TarError, EOFError) as exc:
        raise bad_request("the tar stream is broken (%s); nothing was written" % exc)
    finally:
        tar.close()
    # Checked at the end: a link may only escape once a later member (another link) completes the path.
    for target, member in links:
        if not _inside(tmp, target):
            raise _refuse(member.name, "is a symlink pointing outside the target (%r)" % member.linkname)
    for target, member in reversed(dirs):  # last, so read-only directories could still be filled
        os.chmod(target, member.mode & 0o1777)
        os.utime(target, (member.mtime, member.mtime))
    return count


def merge_tree(src: str, dst: str) -> None:
    """Move the extracted tree `src` into the existing directory `dst`: same-named files are replaced (each
    by one rename), directories are merged (and get `src`'s mode and times), what `src` does not name is
    kept. Also what the client does with a downloaded tree (orchard.sandbox.tar_stream.place_tree)."""
    import shutil

    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        s_dir = os.path.isdir(s) and not os.path.islink(s)
        d_dir = os.path.isdir(d) and not os.path.islink(d)
        if s_dir and d_dir:
            merge_tree(s, d)
            shutil.copystat(s, d)
            continue
        if d_dir:
            shutil.rmtree(d)
        elif s_dir and os.path.lexists(d):
            os.unlink(d)
        os.replace(s, d)
