"""Writes OCI image layouts and docker archives from layers described in Python, offline: for tests of
`orchard image import` and its benchmark (no registry, no container engine).

    layer = [Entry.dir("etc"), Entry.file("etc/motd", b"hi\\n", uid=1000), Entry.whiteout("tmp/old")]
    write_oci_layout(path, [layer], name="localhost/demo:1")   # a directory; tar_of(path, out) for a tar
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass
class Entry:
    """One tar member of a layer."""

    info: tarfile.TarInfo
    data: bytes = b""

    @classmethod
    def _make(cls, name: str, kind: bytes, *, mode: int, uid: int = 0, gid: int = 0, data: bytes = b"",
              link: str = "", xattrs: dict[str, bytes] | None = None) -> "Entry":
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, 1_700_000_000
        info.size, info.linkname = len(data), link
        for key, value in (xattrs or {}).items():
            info.pax_headers["SCHILY.xattr." + key] = value.decode("utf-8", "surrogateescape")
        return cls(info, data)

    @classmethod
    def file(cls, name: str, data: bytes, *, mode: int = 0o644, uid: int = 0, gid: int = 0,
             xattrs: dict[str, bytes] | None = None) -> "Entry":
        return cls._make(name, tarfile.REGTYPE, mode=mode, uid=uid, gid=gid, data=data, xattrs=xattrs)

    @classmethod
    def dir(cls, name: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> "Entry":
        return cls._make(name, tarfile.DIRTYPE, mode=mode, uid=uid, gid=gid)

    @classmethod
    def symlink(cls, name: str, target: str) -> "Entry":
        return cls._make(name, tarfile.SYMTYPE, mode=0o777, link=target)

    @classmethod
    def hardlink(cls, name: str, target: str) -> "Entry":
        return cls._make(name, tarfile.LNKTYPE, mode=0o644, link=target)

    @classmethod
    def whiteout(cls, path: str) -> "Entry":
        head, _, tail = path.rpartition("/")
        return cls.file(f"{head}/.wh.{tail}" if head else f".wh.{tail}", b"")

    @classmethod
    def opaque(cls, directory: str) -> "Entry":
        return cls.file(f"{directory}/.wh..wh..opq", b"")


def layer_tar(entries: list[Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            tar.addfile(entry.info, io.BytesIO(entry.data) if entry.info.isreg() else None)
    return buffer.getvalue()


@dataclass
class Written:
    manifest_digest: str
    config_digest: str
    layer_digests: list[str] = field(default_factory=list)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob(root: Path, data: bytes) -> str:
    digest = _digest(data)
    path = root / "blobs" / "sha256" / digest.split(":")[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def _config(tars: list[bytes], env: list[str]) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux",
                       "config": {"Env": env, "WorkingDir": "/", "Cmd": ["/bin/sh"]},
                       "rootfs": {"type": "layers", "diff_ids": [_digest(t) for t in tars]}}).encode()


def write_oci_layout(root: Path, layers: list[list[Entry]] | list[bytes], *, name: str | None = None,
                     compress: bool = True, env: list[str] | None = None) -> Written:
    """An OCI image layout at directory `root`: each layer an entry list (or a ready tar), gzip'd unless
    `compress` is False; `name` goes into the index's annotations."""
    root.mkdir(parents=True, exist_ok=True)
    tars = [t if isinstance(t, bytes) else layer_tar(t) for t in layers]
    config = _config(tars, env or ["PATH=/usr/local/bin:/usr/bin:/bin"])
    blobs = [gzip.compress(t, compresslevel=1, mtime=0) if compress else t for t in tars]
    layer_digests = [_blob(root, b) for b in blobs]
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _blob(root, config), "size": len(config)},
        "layers": [{"mediaType": MEDIA_LAYER + ("+gzip" if compress else ""), "digest": d, "size": len(b)}
                   for d, b in zip(layer_digests, blobs)]}).encode()
    manifest_digest = _blob(root, manifest)
    descriptor: dict = {"mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": len(manifest)}
    if name:
        descriptor["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [descriptor]}))
    return Written(manifest_digest, _digest(config), layer_digests)


def write_docker_archive(path: Path, layers: list[list[Entry]], *, tags: list[str]) -> str:
    """A `docker save`-style tar at `path` (manifest.json, <id>.json, <n>/layer.tar); returns the image id."""
    tars = [layer_tar(t) for t in layers]
    config = _config(tars, ["PATH=/usr/bin:/bin"])
    image_id = _digest(config)
    manifest = [{"Config": f"{image_id.split(':')[1]}.json", "RepoTags": tags,
                 "Layers": [f"{i}/layer.tar" for i in range(len(tars))]}]
    with tarfile.open(path, "w") as out:
        for name, data in [("manifest.json", json.dumps(manifest).encode()),
                           (manifest[0]["Config"], config),
                           *((f"{i}/layer.tar", t) for i, t in enumerate(tars))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return image_id


def tar_of(directory: Path, out: Path) -> Path:
    """A tar of `directory`'s contents (an oci-archive when it is a layout)."""
    with tarfile.open(out, "w") as tar:
        for entry in sorted(os.listdir(directory)):
            tar.add(directory / entry, arcname=entry)
    return out
