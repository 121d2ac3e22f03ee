"""`orchard image import` and image 'oci:NAME': real archives built offline (hand-made OCI layouts and
docker archives, `podman save`), unpacked into a real store, then run in real local (and Kubernetes)
sandboxes. Malicious and broken archives are refused with nothing left behind."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import secrets
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local.bwrap import image_ids
from orchard.sandbox.images import IdMap, ImageStore
from orchard.testing.oci_layout import Entry, layer_tar, tar_of, write_docker_archive, write_oci_layout
from tests.local_backend_rig import busybox_layer, local_backend, running

ROOT = os.geteuid() == 0
SHIFT = 100000 if ROOT else None  # image uid N is host uid SHIFT + N when root imports (docs/images.md)
# security.capability v2: cap_net_raw permitted+effective, as `setcap cap_net_raw+ep` writes it
CAP_NET_RAW = bytes.fromhex("0100000200200000000000000000000000000000")


def _busybox_layer() -> list[Entry]:
    return busybox_layer(("sh", "ls", "cat", "stat", "test", "id"))


LOWER = [Entry.dir("etc"), Entry.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"),
         Entry.dir("opt", mode=0o750, uid=1000, gid=0), Entry.file("opt/old", b"lower", uid=1000, gid=1000),
         Entry.dir("opt/sub"), Entry.file("opt/sub/deep", b"lower"),
         Entry.dir("gone"), Entry.file("gone/file", b"x"), Entry.file("also-gone", b"x"),
         Entry.file("usr-tool", b"#!/bin/sh\n", mode=0o4755, uid=0, gid=0, xattrs={"security.capability": CAP_NET_RAW}),
         Entry.file("owned", b"mine\n", mode=0o640, uid=1000, gid=2000),
         Entry.file("replaced-by-dir", b"file first"),
         Entry.dir("ro", mode=0o555), Entry.file("ro/old", b"x", mode=0o444)]
UPPER = [Entry.whiteout("gone"), Entry.whiteout("also-gone"),
         Entry.dir("opt", mode=0o750, uid=1000, gid=0), Entry.file("opt/new", b"upper"), Entry.opaque("opt"),
         Entry.symlink("etc/link", "/etc/passwd"), Entry.symlink("up", ".."),
         Entry.file("shared", b"one inode\n", mode=0o600, uid=1000, gid=1000),
         Entry.hardlink("etc/shared-link", "shared"),  # within its layer, as the image spec has them
         Entry.dir("replaced-by-dir"), Entry.file("replaced-by-dir/inside", b"dir now"),
         Entry.whiteout("ro/old"), Entry.file("ro/new", b"y", mode=0o444)]  # into a 0555 dir of a lower layer


def _layout(tmp_path: Path, name: str = "localhost/orchard-test:1", **kw) -> Path:
    write_oci_layout(tmp_path / "layout", [_busybox_layer(), LOWER, UPPER], name=name,
                     env=["PATH=/bin:/opt/image-bin", "FROM_IMAGE=yes", "OVERRIDDEN=image"], **kw)
    return tmp_path / "layout"


@pytest.fixture
def store(tmp_path) -> ImageStore:
    return ImageStore(tmp_path / "images")


def _leftovers(store: ImageStore) -> list[str]:
    """Anything of an import but its locks and the index: temporary dirs, images."""
    if not store.root.exists():
        return []
    return sorted(p.name for p in store.root.iterdir() if not p.name.endswith(".lock") and p.name != "index.json")


def _check_unpacked(rootfs: Path) -> None:
    assert (rootfs / "etc/passwd").read_bytes().startswith(b"root:")
    assert not (rootfs / "gone").exists() and not (rootfs / "also-gone").exists()  # whiteouts
    assert sorted(os.listdir(rootfs / "opt")) == ["new"]  # opaque: the lower old and sub went, new stayed
    assert os.readlink(rootfs / "etc/link") == "/etc/passwd" and os.readlink(rootfs / "up") == ".."
    assert os.stat(rootfs / "etc/shared-link").st_ino == os.stat(rootfs / "shared").st_ino
    assert (rootfs / "replaced-by-dir/inside").read_bytes() == b"dir now"
    assert os.listdir(rootfs / "ro") == ["new"] and os.stat(rootfs / "ro").st_mode & 0o7777 == 0o555
    tool, owned, opt = os.stat(rootfs / "usr-tool"), os.stat(rootfs / "owned"), os.stat(rootfs / "opt")
    assert tool.st_mode & 0o7777 == 0o4755 and owned.st_mode & 0o7777 == 0o640 and opt.st_mode & 0o7777 == 0o750
    if ROOT:
        assert (owned.st_uid, owned.st_gid) == (101000, 102000)
        assert (tool.st_uid, os.stat(rootfs).st_uid, opt.st_uid) == (100000, 100000, 101000)
        assert os.getxattr(rootfs / "usr-tool", "security.capability") == CAP_NET_RAW
    else:
        assert owned.st_uid == os.getuid()


def test_an_oci_layout_unpacks_layers_in_order(store, tmp_path):
    record, names = store.import_archive(_layout(tmp_path), ids=image_ids())
    assert names == ["localhost/orchard-test:1"] and len(record.layers) == 3
    assert store.resolve("oci:localhost/orchard-test:1") == record == store.resolve(record.digest[:19])
    _check_unpacked(store.rootfs(record))
    assert _leftovers(store) == [record.digest.replace(":", "-")]


def test_a_tar_of_a_layout_and_a_docker_archive_unpack_the_same(store, tmp_path):
    layout = _layout(tmp_path, compress=False)
    oci, _ = store.import_archive(tar_of(layout, tmp_path / "oci.tar"), ids=image_ids())
    image_id = write_docker_archive(tmp_path / "docker.tar", [_busybox_layer(), LOWER, UPPER], tags=["demo/docker"])
    docker, names = store.import_archive(tmp_path / "docker.tar", ids=image_ids())
    assert docker.digest == image_id and docker.format == "docker-archive" and names == ["demo/docker:latest"]
    for record in (oci, docker):
        _check_unpacked(store.rootfs(record))


def test_importing_again_reuses_the_image_and_names_only_add(store, tmp_path):
    layout = _layout(tmp_path)
    first, _ = store.import_archive(layout, ids=image_ids())
    marker = store.rootfs(first) / "marker"
    marker.write_text("kept")  # proves the second import did not unpack again
    again, names = store.import_archive(layout, name="other/name", ids=image_ids())
    assert again == first and names == ["other/name:latest"] and marker.exists()
    assert store.index().names == {"localhost/orchard-test:1": first.digest, "other/name:latest": first.digest}
    assert store.remove("other/name") == ["other/name:latest"] and store.rootfs(first).exists()
    assert store.remove("localhost/orchard-test:1") == ["localhost/orchard-test:1", first.digest]
    assert _leftovers(store) == []


def test_a_crashed_imports_leftovers_go_with_the_next_import(store, tmp_path):
    layout = _layout(tmp_path)
    digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    crashed = store.root / f".import-{digest.replace(':', '-')}-x1y2z3" / "rootfs" / "etc"
    crashed.mkdir(parents=True)  # what a killed import left: never renamed into place, never used
    record, _ = store.import_archive(layout, ids=image_ids())
    assert _leftovers(store) == [record.digest.replace(":", "-")]


def test_names_are_read_as_docker_and_kubernetes_read_them(store, tmp_path):
    from orchard.sandbox.images.refs import name_variants

    assert name_variants("debian:12") == ["debian:12", "docker.io/library/debian:12"]
    assert name_variants("docker.io/library/debian:12") == ["docker.io/library/debian:12", "debian:12"]
    assert name_variants("user/app:1") == ["user/app:1", "docker.io/user/app:1"]
    assert name_variants("localhost/app:1") == ["localhost/app:1"]
    assert name_variants("registry.local:5000/app:1") == ["registry.local:5000/app:1"]
    record, names = store.import_archive(_layout(tmp_path, name="docker.io/library/task:7"), ids=image_ids())
    assert names == ["docker.io/library/task:7"]
    assert store.resolve("oci:task:7") == store.resolve("docker.io/library/task:7") == record
    with pytest.raises(InvalidRequest, match="not imported"):
        store.resolve("task")  # :latest
    assert store.remove("task:7") == ["docker.io/library/task:7", record.digest]


def test_concurrent_imports_of_one_image_unpack_it_once(store, tmp_path):
    layout = _layout(tmp_path)

    async def both():
        return await asyncio.gather(*(asyncio.to_thread(store.import_archive, layout, name=f"n/{i}", ids=image_ids())
                                      for i in range(3)))

    results = asyncio.run(both())
    assert len({r.digest for r, _ in results}) == 1
    assert sorted(store.index().names) == ["n/0:latest", "n/1:latest", "n/2:latest"]
    assert _leftovers(store) == [results[0][0].digest.replace(":", "-")]


@pytest.mark.parametrize("layer, why", [
    ([Entry.file("../escape", b"x")], "'..'"),
    ([Entry.file("/abs-escape", b"x")], "absolute"),
    ([Entry.symlink("root-link", "/"), Entry.file("root-link/tmp/escape", b"x")], "symlink"),
    ([Entry.symlink("up", ".."), Entry.file("up/escape", b"x")], "symlink"),
    ([Entry.dir("d"), Entry.symlink("d/l", "../.."), Entry.hardlink("d/l/escape", "etc/passwd")], "symlink"),
    ([Entry.hardlink("stolen", "../../../etc/passwd")], "'..'"),
    ([Entry.symlink("up", ".."), Entry.whiteout("up/etc")], "symlink"),  # a whiteout through it too
    ([Entry.symlink(".", "/")], "root"),
    ([Entry.symlink("pw", "/etc/passwd"), Entry.file("pw", b"overwritten?")], None),  # replaces the link only
])
def test_members_that_escape_the_root_are_refused(store, tmp_path, layer, why):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("untouched")
    passwd = Path("/etc/passwd").read_bytes()
    write_oci_layout(tmp_path / "evil", [[Entry.dir("etc"), Entry.file("etc/passwd", b"image\n")], layer], name="evil/x")
    if why is None:
        record, _ = store.import_archive(tmp_path / "evil", ids=image_ids())
        assert (store.rootfs(record) / "pw").read_bytes() == b"overwritten?"
        assert not (store.rootfs(record) / "pw").is_symlink()
    else:
        with pytest.raises(InvalidRequest, match=why) as refused:
            store.import_archive(tmp_path / "evil", ids=image_ids())
        assert "layer 2 of 2" in str(refused.value)
        assert _leftovers(store) == [] and store.index().names == {}
    assert Path("/etc/passwd").read_bytes() == passwd and not Path("/abs-escape").exists()
    assert not (tmp_path / "escape").exists() and not Path("/tmp/escape").exists()
    assert (outside / "canary").read_text() == "untouched"


def _blob_of(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.split(":")[1]


def test_corrupt_truncated_and_incomplete_archives_are_refused(store, tmp_path):
    layout = _layout(tmp_path)
    written_manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    layers = json.loads(_blob_of(layout, written_manifest).read_text())["layers"]
    archive = tar_of(layout, tmp_path / "whole.tar")
    data = archive.read_bytes()

    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidRequest, match="truncated or corrupt|lacks"):
        store.import_archive(cut, ids=image_ids())

    blob = _blob_of(layout, layers[0]["digest"])  # one byte flipped inside the busybox layer: digest
    good = blob.read_bytes()
    raw = bytearray(good)
    raw[len(raw) // 2] ^= 0xFF
    blob.write_bytes(bytes(raw))
    with pytest.raises(InvalidRequest, match="digest|corrupt"):
        store.import_archive(layout, ids=image_ids())
    blob.write_bytes(good)

    # A layer whose gzip stream ends early, with its digest made to match: the tar inside is truncated.
    short = gzip.compress(layer_tar(_busybox_layer()))[:-5000]
    bad = write_oci_layout(tmp_path / "short", [short], name="short/x", compress=False)
    with pytest.raises(InvalidRequest, match="truncated or corrupt"):
        store.import_archive(tmp_path / "short", ids=image_ids())
    assert bad.layer_digests

    _blob_of(layout, layers[1]["digest"]).unlink()
    with pytest.raises(InvalidRequest, match="lacks"):
        store.import_archive(layout, ids=image_ids())
    with pytest.raises(InvalidRequest, match="not an image archive"):
        store.import_archive(tmp_path / "short" / "blobs", ids=image_ids())
    (tmp_path / "not-a-tar").write_bytes(b"hello" * 100)
    with pytest.raises(InvalidRequest, match="not a readable tar"):
        store.import_archive(tmp_path / "not-a-tar", ids=image_ids())
    assert _leftovers(store) == [] and store.index().names == {}


def test_zstd_layers_need_the_zstandard_module(store, tmp_path, monkeypatch):
    from orchard.sandbox.images import blobs

    monkeypatch.setattr(blobs, "zstandard", None)  # as without the module, whether or not it is installed
    zstd = shutil.which("zstd")
    frame = (subprocess.run([zstd, "-q", "-c"], input=layer_tar(LOWER), capture_output=True, check=True).stdout
             if zstd else b"\x28\xb5\x2f\xfd" + b"\0" * 64)
    write_oci_layout(tmp_path / "zstd", [frame], name="z/x", compress=False)
    with pytest.raises(InvalidRequest, match="zstd.*zstandard"):
        store.import_archive(tmp_path / "zstd", ids=image_ids())
    assert _leftovers(store) == []


def test_unknown_images_name_the_import_command(store):
    for ref in ("oci:nothing/here:1", "nothing/here", "sha256:" + "ab" * 32, "Not A Name"):
        with pytest.raises(InvalidRequest, match="orchard image import FILE"):
            store.resolve(ref)
    with pytest.raises(InvalidRequest, match="not imported"):
        store.remove("nothing/here")


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (scripts/setup-system.sh)")
def test_podman_save_archives_import(store, tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/hello").write_text("from podman\n")
    os.link(rootfs / "etc/hello", rootfs / "etc/hello-link")
    (rootfs / "lib").symlink_to("usr/lib")
    name = f"localhost/orchard-test-{secrets.token_hex(4)}:1"
    tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["podman", "import", "-", name], input=tar, capture_output=True, check=True)
    try:
        for fmt in ("oci-archive", "docker-archive", "oci-dir"):
            out = tmp_path / fmt
            subprocess.run(["podman", "save", "--format", fmt, "-o", str(out), name], capture_output=True, check=True)
            record, names = store.import_archive(out, ids=image_ids())
            assert names == [name], fmt
            root = store.rootfs(record)
            assert (root / "etc/hello").read_text() == "from podman\n"
            assert os.stat(root / "etc/hello").st_ino == os.stat(root / "etc/hello-link").st_ino
            assert os.readlink(root / "lib") == "usr/lib"
    finally:
        subprocess.run(["podman", "rmi", "-f", name], capture_output=True)


# ---- running the image ---------------------------------------------------------------------------------

async def test_a_local_sandbox_runs_an_imported_image(store, tmp_path, bundle_cache):
    store.import_archive(_layout(tmp_path), ids=image_ids())
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache, image_dir=store.root) as backend:
        assert "oci" in backend.capabilities.image_kinds
        for image in ("oci:localhost/orchard-test:1", "localhost/orchard-test:1"):
            async with running(backend, SandboxSpec(image=image, env={"OVERRIDDEN": "spec"})) as (_, sb):
                env = await sb.exec("echo $PATH $FROM_IMAGE $OVERRIDDEN")  # the image's ENV, under the spec's
                assert env.stdout == "/bin:/opt/image-bin yes spec\n", env
                # (the sandbox's root has no capabilities: /opt, 0750 of uid 1000, is its to list as group 0)
                seen = await sb.exec("cat /etc/passwd; ls /opt/new; test -e /gone || echo gone-is-gone; "
                                     "stat -c '%u:%g %a' /owned /usr-tool; id -u; readlink /etc/link")
                assert seen.exit_code == 0, seen
                uid = "1000:2000" if ROOT else "0:0"  # the importer's files are the sandbox root's otherwise
                tool = "0:0 4755"
                assert seen.stdout.splitlines() == ["root:x:0:0:root:/root:/bin/sh", "/opt/new", "gone-is-gone",
                                                    f"{uid} 640", tool, "0", "/etc/passwd"], seen.stdout
                await sb.exec("echo changed > /etc/passwd")  # the sandbox's overlay, never the store
        record = store.resolve("localhost/orchard-test:1")
        assert (store.rootfs(record) / "etc/passwd").read_bytes().startswith(b"root:x")
        with pytest.raises(InvalidRequest, match="orchard image import FILE"):
            await backend.create("missing", SandboxSpec(image="oci:localhost/not-imported:1"), "t")
        assert not (tmp_path / "sandboxes" / "missing").exists()


@pytest.mark.skipif(not ROOT, reason="only root's imports shift ids")
async def test_an_image_imported_with_other_ids_is_refused_by_name(store, tmp_path, bundle_cache):
    store.import_archive(_layout(tmp_path), ids=IdMap(base=200000, count=65535))
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache, image_dir=store.root) as backend:
        with pytest.raises(InvalidRequest, match="import FILE` again"):
            await backend.create("other", SandboxSpec(image="oci:localhost/orchard-test:1"), "t")


# ---- Kubernetes ----------------------------------------------------------------------------------------

@pytest.mark.k8s
@pytest.mark.slow
async def test_the_same_name_runs_on_kubernetes_after_a_cluster_import(tmp_path):
    from tests.k8s_cluster import CLUSTER_SCRIPT, POD_PIDS_LIMIT, require_cluster

    kubeconfig = require_cluster()
    from orchard.sandbox.backends.kubernetes.images import import_injector_image
    from orchard.sandbox.backends.kubernetes import KubernetesBackend

    name = "localhost/orchard-oci-test:k8s"  # one name, imported over on each run: nothing piles up
    layout = _layout(tmp_path, name=name)
    done = subprocess.run(["bash", str(CLUSTER_SCRIPT), "import-archive", str(layout), name],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    backend = KubernetesBackend(namespace=f"orchard-oci-{secrets.token_hex(3)}", instance="oci",
                                agent_image=import_injector_image(CLUSTER_SCRIPT), image_pull_policy="Never",
                                kubeconfig=kubeconfig, pod_pids_limit=POD_PIDS_LIMIT)
    try:
        sandbox_id, token = f"sb-{secrets.token_hex(5)}", secrets.token_hex(16)
        made = await backend.create(sandbox_id, SandboxSpec(image=f"oci:{name}"), token)
        async with AgentSandbox(sandbox_id, made.agent_url, token) as sb:
            seen = await sb.exec("cat /etc/passwd; ls /opt/new; test -e /gone || echo gone-is-gone; stat -c '%u:%g' /owned")
            assert seen.stdout.splitlines() == ["root:x:0:0:root:/root:/bin/sh", "/opt/new", "gone-is-gone",
                                                "1000:2000"], seen
        await backend.delete(made)
    finally:
        for live in await backend.list_live():
            await backend.delete(live)
        await backend.close()


# ---- docs/images.md ------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "images.md"


def test_the_images_page_commands_exist():
    from tests import doc_blocks

    doc_blocks.check_cli_lines(DOC)
    doc_blocks.check_shell_lines(DOC)


def test_the_images_page_example_runs_an_imported_image(tmp_path, sandbox_home, monkeypatch, capsys):
    from tests import doc_blocks

    monkeypatch.setenv("ORCHARD_HOME", str(sandbox_home))
    release = [Entry.dir("etc"), Entry.file("etc/os-release", b'PRETTY_NAME="Imported"\n')]
    write_oci_layout(tmp_path / "task", [_busybox_layer(), release], name="localhost/task:1",
                     env=["PATH=/bin:/opt/task/bin"])
    ImageStore(sandbox_home / "images").import_archive(tmp_path / "task", ids=image_ids())
    [(_, code, line)] = doc_blocks.of_kind(DOC, "python")
    doc_blocks.run_python(code, f"images.md:{line}", {})
    assert capsys.readouterr().out == 'PRETTY_NAME="Imported"\n/bin:/opt/task/bin\n\n'


def test_the_cli_imports_lists_and_removes(tmp_path):
    from typer.testing import CliRunner

    from orchard.cli.main import app

    home = tmp_path / "home"
    run = lambda *args: CliRunner().invoke(app, ["image", *args, "--home", str(home)])  # noqa: E731
    imported = run("import", str(_layout(tmp_path)), "--name", "localhost/cli:1")
    assert imported.exit_code == 0, imported.output
    assert "localhost/cli:1" in imported.output and "oci:localhost/cli:1" in imported.output
    listed = run("list")
    assert listed.exit_code == 0 and "localhost/cli:1" in listed.output and "3" in listed.output
    missing = run("import", str(tmp_path / "no-such.tar"))
    assert missing.exit_code == 1 and "does not exist" in " ".join(missing.output.split())
    removed = run("rm", "localhost/cli:1")
    assert removed.exit_code == 0 and "localhost/cli:1" in removed.output
    assert run("rm", "localhost/cli:1").exit_code == 1
    assert ImageStore(home / "images").records() == []
