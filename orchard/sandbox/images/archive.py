"""Which image an archive holds, and its layers in order.

Two layouts: an OCI image layout (`oci-layout`, `index.json`, `blobs/<alg>/<hex>`: `podman save --format
oci-archive`, `skopeo copy oci:`, docker ≥ 25's `docker save`) and the docker archive (`manifest.json`
listing each image's config, RepoTags and layer tars: older `docker save`, `podman save`). An OCI index
may nest indexes (multi-platform images): the manifest for this machine's platform is taken."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field

from orchard.core.errors import InvalidRequest
from orchard.sandbox.images.blobs import ArchiveFiles, blob_path, check_bytes, parse_digest
from orchard.sandbox.images.models import ImageConfig

INDEX_TYPES = {"application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json"}
# The annotations that name an image in an OCI index (containerd's carries the full name).
NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}
MAX_NESTING = 4


@dataclass
class Layer:
    """A layer's file in the archive; `digest` is what its bytes as stored must hash to (compressed, for
    an OCI blob), or, with `uncompressed`, what the tar inside must hash to (a docker archive's diff id).
    `declared_size`: the size of its bytes as stored, as the manifest declares it (an OCI descriptor's
    `size`; a docker archive declares none)."""

    path: str
    digest: str
    uncompressed: bool
    declared_size: int | None = None


@dataclass
class ArchiveImage:
    digest: str  # the store's key
    format: str
    layers: list[Layer]
    config: ImageConfig
    names: list[str] = field(default_factory=list)


def read_image(files: ArchiveFiles) -> ArchiveImage:
    if files.exists("index.json"):
        image = _oci_image(files)
        if files.exists("manifest.json"):  # docker ≥ 25 writes both: its tags as the user gave them are here
            tags = [str(n) for entry in _docker_entries(files) for n in entry.get("RepoTags") or []]
            image.names = sorted(set(image.names) | set(tags))
        return image
    if files.exists("manifest.json"):
        return _docker_image(files)
    raise InvalidRequest(f"{files.source} is not an image archive: it has neither index.json (an OCI layout) "
                         "nor manifest.json (a docker archive); save it with `docker save`, `podman save` or "
                         "`skopeo copy ... oci:DIR`")


def _json(data: bytes, what: str) -> dict | list:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"{what} is not valid JSON ({e}): the archive is corrupt") from None


def _oci_image(files: ArchiveFiles) -> ArchiveImage:
    index = _json(files.read_json_bytes("index.json"), f"{files.source}: index.json")
    candidates: list[tuple[dict, list[str]]] = []
    _collect(files, index, [], candidates, 0)
    if not candidates:
        raise InvalidRequest(f"{files.source}: its index lists no image manifest for {_platform()}")
    if len(candidates) > 1:
        digests = sorted({d["digest"] for d, _ in candidates})
        if len(digests) > 1:
            raise InvalidRequest(f"{files.source} holds {len(digests)} images; import an archive of one image "
                                 "(`podman save IMAGE`, `skopeo copy`)")
    descriptor, names = candidates[0]
    names = sorted({n for _, ns in candidates for n in ns})
    manifest_bytes = files.read_blob(descriptor["digest"], "image manifest")
    manifest = _json(manifest_bytes, f"{files.source}: the image manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list) or "config" not in manifest:
        raise InvalidRequest(f"{files.source}: the image manifest has no config and layers: not an image manifest")
    config = _config(files.read_blob(manifest["config"].get("digest"), "image config"), files)
    layers = [Layer(blob_path(layer.get("digest")), layer["digest"], uncompressed=False,
                    declared_size=_declared_size(layer, files)) for layer in manifest["layers"]]
    return ArchiveImage(digest=descriptor["digest"], format="oci", layers=layers, config=config, names=names)


def _declared_size(descriptor: object, files: ArchiveFiles) -> int:
    """A layer descriptor's `size` (required by the OCI image spec): what its blob may hold, and what its
    unpacked size is measured against (blobs.LayerPipe)."""
    size = descriptor.get("size") if isinstance(descriptor, dict) else None
    if type(size) is not int or size < 0:
        raise InvalidRequest(f"{files.source}: a layer of the image manifest has no valid size ({str(size)[:40]!r}): "
                             "the archive is corrupt; save the image again")
    return size


def _collect(files: ArchiveFiles, index: object, names: list[str], out: list, depth: int) -> None:
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise InvalidRequest(f"{files.source}: an image index has no manifests list: the archive is corrupt")
    if depth > MAX_NESTING:
        raise InvalidRequest(f"{files.source}: image indexes nest deeper than {MAX_NESTING}")
    for descriptor in index["manifests"]:
        if not isinstance(descriptor, dict):
            continue
        parse_digest(descriptor.get("digest"), f"{files.source}: a manifest in the index")
        annotations = descriptor.get("annotations") or {}
        here = names + [_name(annotations, k) for k in NAME_ANNOTATIONS if annotations.get(k)]
        if descriptor.get("mediaType") in INDEX_TYPES:
            nested = _json(files.read_blob(descriptor["digest"], "image index"), f"{files.source}: an index")
            _collect(files, nested, here, out, depth + 1)
        elif _fits(descriptor.get("platform")):
            out.append((descriptor, [n for n in here if n]))


def _name(annotations: dict, key: str) -> str:
    """A full name (`repo:tag`); a bare tag in ref.name (skopeo's `oci:DIR:latest`) names nothing."""
    value = str(annotations[key])
    if key == "org.opencontainers.image.ref.name" and "/" not in value and ":" not in value:
        return ""
    return value


def _fits(platform_entry: object) -> bool:
    if not isinstance(platform_entry, dict):
        return True  # no platform given: the only image
    return (platform_entry.get("os") in (None, "linux")
            and platform_entry.get("architecture") in (None, _platform().split("/")[1]))


def _platform() -> str:
    machine = platform.machine()
    return f"linux/{ARCHITECTURES.get(machine, machine)}"


def _docker_entries(files: ArchiveFiles) -> list[dict]:
    entries = _json(files.read_json_bytes("manifest.json"), f"{files.source}: manifest.json")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise InvalidRequest(f"{files.source}: manifest.json lists no images: the archive is corrupt or empty")
    return entries


def _docker_image(files: ArchiveFiles) -> ArchiveImage:
    entries = _docker_entries(files)
    if len(entries) > 1:
        raise InvalidRequest(f"{files.source} holds {len(entries)} images; save one image per archive "
                             "(`docker save IMAGE -o FILE`)")
    entry = entries[0]
    config_path, layer_paths = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_path, str) or not isinstance(layer_paths, list):
        raise InvalidRequest(f"{files.source}: manifest.json lacks Config or Layers: the archive is corrupt")
    config_bytes = files.read_json_bytes(config_path)
    # The config's file is named by its digest (`<hex>.json`, or `blobs/sha256/<hex>`): that is docker's
    # image id, and the store's key for this image.
    digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    stem = config_path.rsplit("/", 1)[-1].removesuffix(".json")
    if len(stem) == 64 and not stem.strip("0123456789abcdef"):
        check_bytes(config_bytes, f"sha256:{stem}", f"{files.source}: the image config {config_path}")
    config = _config(config_bytes, files)
    raw = _json(config_bytes, "")
    diff_ids = (raw.get("rootfs") or {}).get("diff_ids") if isinstance(raw, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_paths):
        raise InvalidRequest(f"{files.source}: the image config lists {len(diff_ids or [])} layer digests for "
                             f"{len(layer_paths)} layers: the archive is corrupt")
    layers = [Layer(str(path), str(diff_id), uncompressed=True) for path, diff_id in zip(layer_paths, diff_ids)]
    return ArchiveImage(digest=digest, format="docker-archive", layers=layers, config=config,
                        names=[str(n) for n in entry.get("RepoTags") or []])


def _config(data: bytes, files: ArchiveFiles) -> ImageConfig:
    raw = _json(data, f"{files.source}: the image config")
    inner = raw.get("config") if isinstance(raw, dict) else None
    if not isinstance(inner, dict):
        return ImageConfig()

    def strings(value: object) -> list[str]:
        return [str(v) for v in value] if isinstance(value, list) else []

    return ImageConfig(env=strings(inner.get("Env")), working_dir=str(inner.get("WorkingDir") or ""),
                       user=str(inner.get("User") or ""), entrypoint=strings(inner.get("Entrypoint")),
                       cmd=strings(inner.get("Cmd")))
