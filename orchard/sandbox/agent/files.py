"""`/files`: read (streamed from disk with sendfile; 413 before sending when over the caller's `max_bytes`),
write (streamed to a temp file beside the target, fsync'd, then renamed over it so readers never see half a
file), delete, stat and list.

shutil and tempfile are imported by the handlers that use them: every sandbox's start would pay for them."""

from __future__ import annotations

import os
import stat as stat_module

from .wire import CHUNK, bad_request, not_found, too_large


def file_info(path: str) -> dict:
    """FileInfo (orchard/core/sandbox.py) of an existing path; a symlink reports its target's type and
    size (its own when dangling). `mode` holds the permission bits."""
    st = os.lstat(path)
    is_symlink = stat_module.S_ISLNK(st.st_mode)
    if is_symlink:
        try:
            st = os.stat(path)
        except OSError:
            pass
    return {"path": path, "name": os.path.basename(path) or path, "exists": True,
            "is_dir": stat_module.S_ISDIR(st.st_mode), "is_symlink": is_symlink, "size": st.st_size,
            "mode": stat_module.S_IMODE(st.st_mode), "mtime": st.st_mtime}


def _missing(path: str):
    return not_found("%s does not exist in the sandbox; check the path (relative paths are under the "
                     "workdir)" % path)


def handle_read(req):
    path = req.context.resolve(req.param("path", required=True))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _missing(path)
    if stat_module.S_ISDIR(st.st_mode):
        raise bad_request("%s is a directory; use GET /files/list to list it or GET /tar to download it"
                          % path)
    if not stat_module.S_ISREG(st.st_mode):  # opening a FIFO or device could block or never end
        raise bad_request("%s is not a regular file" % path)
    max_bytes = _parse_max_bytes(req.param("max_bytes"))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if max_bytes is not None and size > max_bytes:  # refused before a byte of it is sent
            raise too_large("%s is %d bytes, over the max_bytes=%d of this read; read a part of it (e.g. "
                            "`head -c`), download it to a file, or ask for a larger max_bytes"
                            % (path, size, max_bytes))
        req.send_file(f, size)


def _parse_max_bytes(text):
    """The `max_bytes` query parameter of GET /files: None (no cap) or a non-negative integer."""
    if text is None or text == "":
        return None
    if not (text.isdigit() and text.isascii() and len(text) <= 19):
        raise bad_request("max_bytes must be a non-negative integer number of bytes, not %r" % text[:30])
    return int(text)


def _parse_mode(text):
    if text is None or text == "":
        return None
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise bad_request("mode must be octal permission bits such as 0644 or 755, not %r" % text)
    return mode


def handle_write(req) -> dict:
    path = req.context.resolve(req.param("path", required=True))
    mode = _parse_mode(req.param("mode"))
    body = req.body()  # checks the size limit before anything is written
    if os.path.isdir(path):
        raise bad_request("%s is a directory; write to a file path inside it instead" % path)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except FileExistsError:
        raise bad_request("cannot create %s: a parent of it is a file, not a directory" % path)
    except NotADirectoryError:
        raise bad_request("cannot create %s: a parent of it is a file, not a directory" % path)
    if mode is None:  # keep the mode of the file being replaced, else the usual umask default
        try:
            mode = stat_module.S_IMODE(os.stat(path).st_mode)
        except OSError:
            mode = 0o666 & ~req.context.umask
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=parent, prefix="." + os.path.basename(path) + ".", suffix=".orchard-tmp")
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                data = body.read(CHUNK)
                if not data:
                    break
                out.write(data)
                size += len(data)
            out.flush()
            os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"path": path, "size": size}


def handle_delete(req) -> dict:
    path = req.context.resolve(req.param("path", required=True))
    recursive = req.flag("recursive")
    if not os.path.lexists(path):
        raise _missing(path)
    if os.path.isdir(path) and not os.path.islink(path):
        if recursive:
            import shutil

            shutil.rmtree(path)
        else:
            try:
                os.rmdir(path)
            except OSError:
                raise bad_request("%s is a directory that is not empty; pass recursive=1 to delete it "
                                  "with its contents" % path)
    else:
        os.unlink(path)
    return {}


def handle_stat(req) -> dict:
    path = req.context.resolve(req.param("path", required=True))
    try:
        return file_info(path)
    except FileNotFoundError:
        raise _missing(path)


def handle_list(req) -> dict:
    path = req.context.resolve(req.param("path", required=True))
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        raise _missing(path)
    except NotADirectoryError:
        raise bad_request("%s is not a directory; use GET /files/stat for a file" % path)
    except PermissionError:
        raise bad_request("%s is not readable by the agent (permission denied)" % path)
    entries = []
    for name in names:
        try:
            entries.append(file_info(os.path.join(path, name)))
        except FileNotFoundError:  # removed while listing
            pass
    return {"entries": entries}
