"""`orchard image import` of crafted archives: a small gzip layer that inflates to far more than it could
hold (a decompression bomb: 2 MB of gzip is 2 GiB of zeros, all written to the host's disk by the
import), and a layer blob larger than its manifest declares. Each is refused while it is read, with
nothing of the image left in the store. Real archives, a real store, the real CLI."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zlib
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from orchard.core.errors import InvalidRequest
from orchard.sandbox.backends.local.bwrap import image_ids
from orchard.sandbox.images import ImageStore
from orchard.sandbox.images.blobs import DEFAULT_MAX_EXPANSION, EXPANSION_ALLOWANCE, MAX_EXPANSION_ENV
from orchard.testing.oci_layout import Entry, layer_tar, write_oci_layout

BOMB_BYTES = 256 << 20  # inflated; its gzip is about 250 KB, so the cap (100 x that + 64 MiB) is far below


def zero_file_tar(size: int) -> Iterator[bytes]:
    """A layer tar holding one file of `size` zero bytes, in pieces (never all in memory)."""
    info = tarfile.TarInfo("zeros")
    info.size, info.mode = size, 0o644
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    block = bytes(1 << 20)
    left = size
    while left:
        yield block[:min(left, len(block))]
        left -= min(left, len(block))
    yield bytes(-size % 512 + 1024)  # the member's padding, then the end-of-archive blocks


def gzip_bomb(size: int = BOMB_BYTES) -> tuple[bytes, str]:
    """(the gzip'd layer, the digest of the tar inside: a docker archive's diff id)."""
    deflate, tar_hash, out = zlib.compressobj(9, zlib.DEFLATED, 31), hashlib.sha256(), []
    for piece in zero_file_tar(size):
        tar_hash.update(piece)
        out.append(deflate.compress(piece))
    out.append(deflate.flush())
    return b"".join(out), "sha256:" + tar_hash.hexdigest()


def docker_archive(path: Path, layer: bytes, diff_id: str) -> Path:
    """A `docker save` archive whose one layer.tar is `layer` as given (here: gzip'd, which import takes)."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": ["bomb/docker:1"], "Layers": ["0/layer.tar"]}])
    with tarfile.open(path, "w") as out:
        for name, data in [("manifest.json", manifest.encode()), (config_name, config), ("0/layer.tar", layer)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return path


def declare_layer_size(layout: Path, manifest_digest: str, size: object) -> None:
    """Rewrite the layout's manifest with its first layer's `size` changed (and the index pointing at it)."""
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / manifest_digest.split(":")[1]).read_bytes())
    manifest["layers"][0]["size"] = size
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0].update(digest=f"sha256:{digest}", size=len(data))
    (layout / "index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def bomb() -> tuple[bytes, str]:
    return gzip_bomb()


@pytest.fixture
def store(tmp_path) -> ImageStore:
    return ImageStore(tmp_path / "images")


def leftovers(store: ImageStore) -> list[str]:
    """Anything of an import but its locks and the index: temporary dirs, images."""
    if not store.root.exists():
        return []
    return sorted(p.name for p in store.root.iterdir() if not p.name.endswith(".lock") and p.name != "index.json")


def archive(kind: str, tmp_path: Path, bomb: tuple[bytes, str]) -> Path:
    layer, diff_id = bomb
    if kind == "oci":
        write_oci_layout(tmp_path / "layout", [layer], name="bomb/oci:1", compress=False)
        return tmp_path / "layout"
    return docker_archive(tmp_path / "docker.tar", layer, diff_id)


@pytest.mark.parametrize("kind", ["oci", "docker-archive"])
def test_a_gzip_bomb_layer_is_refused_while_it_inflates_and_leaves_nothing(store, tmp_path, bomb, kind):
    assert len(bomb[0]) * DEFAULT_MAX_EXPANSION + EXPANSION_ALLOWANCE < BOMB_BYTES  # the premise
    with pytest.raises(InvalidRequest, match=f"decompression bomb.*{MAX_EXPANSION_ENV}"):
        store.import_archive(archive(kind, tmp_path, bomb), ids=image_ids())
    assert leftovers(store) == [] and store.index().names == {}


def test_the_cli_refuses_the_bomb_with_exit_1_and_says_what_to_do(tmp_path, bomb):
    from orchard.cli.main import app

    home = tmp_path / "home"
    result = CliRunner().invoke(app, ["image", "import", str(archive("oci", tmp_path, bomb)), "--home", str(home)])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "decompression bomb" in text and MAX_EXPANSION_ENV in text, text
    assert leftovers(ImageStore(home / "images")) == []


def test_a_genuine_layer_over_the_ratio_imports_with_the_cap_raised(store, tmp_path, bomb, monkeypatch):
    """The way out the message names: the operator vouches for the image."""
    monkeypatch.setenv(MAX_EXPANSION_ENV, "2000")
    record, names = store.import_archive(archive("oci", tmp_path, bomb), ids=image_ids())
    assert names == ["bomb/oci:1"]
    assert (store.rootfs(record) / "zeros").stat().st_size == BOMB_BYTES


def test_a_layer_bigger_than_its_manifest_declares_is_refused(store, tmp_path):
    layout = tmp_path / "layout"
    written = write_oci_layout(layout, [[Entry.file("etc/hello", b"hello\n" * 1000)]], name="short/decl:1")
    declare_layer_size(layout, written.manifest_digest, 10)  # the blob is larger; its digest still matches
    with pytest.raises(InvalidRequest, match="more than the 10 bytes its manifest declares"):
        store.import_archive(layout, ids=image_ids())
    assert leftovers(store) == []


def test_a_layer_without_a_valid_declared_size_is_refused(store, tmp_path):
    layout = tmp_path / "layout"
    written = write_oci_layout(layout, [layer_tar([Entry.file("a", b"a")])], name="no/size:1")
    declare_layer_size(layout, written.manifest_digest, "big")
    with pytest.raises(InvalidRequest, match="no valid size"):
        store.import_archive(layout, ids=image_ids())
    assert leftovers(store) == []
