"""Harness bundles, built for real (Debian's Python 3.13 from deb.debian.org, a pin from PyPI) and mounted
into real local sandboxes: on the host image and on a rootfs with no Python at all, read-only; concurrent
builders; a failing build leaves nothing; unknown and unbuilt bundles are refused before anything exists;
the CLI. The big built-in bundles are built by one slow test."""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.core.errors import InvalidRequest
from orchard.core.harness_bundle import HarnessBundleSpec, get_bundle_spec
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.harness_bundles.build import ensure_bundle
from orchard.sandbox.harness_bundles.store import require_built
from tests.harness_bundle_rig import TINY, TINY_SPEC, UNBUILT, register_test_bundles, shared_downloads
from tests.local_backend_rig import local_backend
from tests.test_local_backend import running

MOUNT = f"/.orchard/harness/{TINY}"


@pytest.fixture(scope="session")
def bundle_home(tmp_path_factory, session_bundles) -> Path:
    """An Orchard home whose cache (the session's) holds the agent bundle and the tiny harness bundle."""
    register_test_bundles(tmp_path_factory.mktemp("bundle-site"))
    home = session_bundles.home(tmp_path_factory.mktemp("harness-home"))
    started = time.monotonic()
    built = ensure_bundle(get_bundle_spec(TINY), home / "cache", downloads=shared_downloads())
    print(f"tiny harness bundle: built in {time.monotonic() - started:.1f} s, {built.manifest.size_bytes >> 20} MB")
    return home


@pytest.fixture
async def backend(tmp_path, bundle_home):
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_home / "cache") as made:
        yield made


def _leftovers(cache: Path, name: str) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.lstrip(".").startswith(f"harness-{name}-"))


# ---- the spec --------------------------------------------------------------------------------------------

def test_a_spec_takes_exact_pins_only_and_resolves_its_entry_at_the_mount_point():
    with pytest.raises(ValueError, match="exact pin"):
        HarnessBundleSpec(name="x", requirements=["tabulate>=0.9"])
    with pytest.raises(ValueError, match="Debian package"):
        HarnessBundleSpec(name="x", debian_packages=["Rip Grep"])
    spec = HarnessBundleSpec(name="x", requirements=["a[b,c]==1.0"], entry=["tool", "--flag"],
                             env={"HOME_OF": "{bundle}/data"})
    assert spec.entry_argv("more") == ["/.orchard/harness/x/venv/bin/tool", "--flag", "more"]
    assert spec.entry_env() == {"HOME_OF": "/.orchard/harness/x/data"}


def test_builtin_specs_are_found_by_name():
    for name in ("kimi-cli", "openhands", "mini-swe-agent"):
        assert get_bundle_spec(name).name == name
    assert get_bundle_spec("kimi-cli").requirements == ["kimi-cli==1.51.0"]  # 1.52.0 is a stub
    assert "ripgrep" in get_bundle_spec("kimi-cli").debian_packages


# ---- in sandboxes ----------------------------------------------------------------------------------------

PROBE = (f"{MOUNT}/venv/bin/python -c 'import sys, tabulate; print(sys.version_info[:2], tabulate.__file__)'; "
         f"printf 'a 1\\nb 2\\n' | {MOUNT}/venv/bin/tabulate; "
         f"echo '{{\"k\": 1}}' | {MOUNT}/venv/bin/python -m json.tool --compact; "
         f"touch {MOUNT}/venv/x 2>/dev/null && echo WROTE-BUNDLE; "
         f"mkdir /.orchard/harness/y 2>/dev/null && echo WROTE-ROOT; echo done")


def _check_probe(stdout: str, stderr: str = "") -> None:
    stdout = stdout + stderr
    assert "(3, 13)" in stdout and f"{MOUNT}/venv/lib/python3.13/site-packages/tabulate" in stdout, stdout
    assert "-  -" in stdout and "a  1" in stdout, stdout  # the console script ran
    assert '{"k":1}' in stdout, stdout  # -m of the bundle's own modules
    assert "WROTE" not in stdout and "\ndone\n" in stdout, stdout  # read-only, bundle and mount root


async def test_the_bundle_runs_on_the_host_image(backend):
    async with running(backend, SandboxSpec(bundles=[TINY])) as (_, agent):
        r = await agent.exec(PROBE)
        assert r.ok, r.stderr
        _check_probe(r.stdout, r.stderr)
        # The task's own tools are the host's: the bundle leaks no library path into them.
        r = await agent.exec("python3 -c 'import sys; print(sys.version_info[:2])'; echo LD=$LD_LIBRARY_PATH")
        assert "(3, 13)" not in r.stdout and r.stdout.split()[-1] == "LD=", r.stdout


async def test_the_bundle_runs_on_a_rootfs_without_python(backend, busybox_rootfs):
    spec = SandboxSpec(image=str(busybox_rootfs), bundles=[TINY])
    async with running(backend, spec) as (_, agent):
        r = await agent.exec("python3 --version; " + PROBE)
        assert r.ok, r.stderr
        _check_probe(r.stdout, r.stderr)
        assert "not found" in r.stderr  # the image itself has no Python


async def test_sandboxes_without_bundles_have_no_harness_mount(backend):
    async with running(backend) as (_, agent):
        r = await agent.exec("ls -A /.orchard/harness; grep -c /.orchard/harness /proc/self/mountinfo")
        assert r.stdout.split() == ["0"], r.stdout


async def test_unknown_and_unbuilt_bundles_are_refused_before_anything_exists(backend):
    with pytest.raises(InvalidRequest, match=r"unknown harness bundle 'nope'; available: .*kimi-cli.*tiny-test"):
        await backend.create("b1", SandboxSpec(bundles=["nope"]), secrets.token_hex(8))
    with pytest.raises(InvalidRequest, match=f"not built on this server.*orchard harness build {UNBUILT}"):
        await backend.create("b2", SandboxSpec(bundles=[TINY, UNBUILT]), secrets.token_hex(8))
    assert not backend.root_dir.exists() or not any(backend.root_dir.iterdir())


# ---- building --------------------------------------------------------------------------------------------

def test_a_built_bundle_is_found_by_name_and_its_manifest_says_what_went_in(bundle_home):
    built, = require_built([TINY], bundle_home / "cache")
    m = built.manifest
    assert m.spec == TINY_SPEC and m.python_version.startswith("3.13.")
    assert m.installed == {"tabulate": "0.9.0"}
    assert "python3.13-minimal" in m.debian and "libc6" in m.debian
    assert os.access(built.path / "usr/bin/python3.13", os.X_OK)
    assert not _leftovers(bundle_home / "cache", TINY)[1:], "one published bundle, no temp dirs"


def test_concurrent_builders_publish_one_bundle(tmp_path, bundle_home):
    spec = HarnessBundleSpec(name="tiny-race", requirements=["tabulate==0.9.0"])
    cache, results, errors = tmp_path / "cache", [], []

    def build():
        try:
            results.append(ensure_bundle(spec, cache, downloads=shared_downloads()).path)
        except Exception as e:  # noqa: BLE001 — reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert _leftovers(cache, "tiny-race") == [results[0].name]


def test_a_bad_pin_fails_clearly_and_leaves_nothing(tmp_path, bundle_home):
    spec = HarnessBundleSpec(name="tiny-bad", requirements=["tabulate==0.0.0.1"])
    with pytest.raises(InvalidRequest, match=r"pip cannot install tabulate==0.0.0.1 for Python 3.13"):
        ensure_bundle(spec, tmp_path, downloads=shared_downloads())
    assert _leftovers(tmp_path, "tiny-bad") == []


def test_an_unknown_debian_package_fails_clearly_and_leaves_nothing(tmp_path, bundle_home):
    spec = HarnessBundleSpec(name="tiny-deb", debian_packages=["no-such-package-xyz"])
    with pytest.raises(InvalidRequest, match="Debian trixie has no package no-such-package-xyz"):
        ensure_bundle(spec, tmp_path, downloads=shared_downloads())
    assert _leftovers(tmp_path, "tiny-deb") == []
    with pytest.raises(InvalidRequest, match="Python 3.9"):
        ensure_bundle(HarnessBundleSpec(name="tiny-old", python="3.9"), tmp_path)


def test_a_locked_spec_installs_exactly_its_pins(tmp_path, bundle_home):
    """`locked=True` installs with --no-deps: python-dateutil without the `six` it depends on."""
    spec = HarnessBundleSpec(name="tiny-locked", requirements=["python-dateutil==2.9.0.post0"], locked=True)
    built = ensure_bundle(spec, tmp_path, downloads=shared_downloads())
    assert built.manifest.installed == {"python-dateutil": "2.9.0.post0"}


def test_the_openhands_lock_holds_its_top_level_pins():
    from orchard.harnesses.openhands.bundle import SPEC, TOP_LEVEL

    assert SPEC.locked and set(TOP_LEVEL) <= set(SPEC.requirements)
    assert len({pin.split("==")[0].lower() for pin in SPEC.requirements}) == len(SPEC.requirements) > 100


# ---- the CLI ---------------------------------------------------------------------------------------------

def test_cli_lock_prints_every_distribution_the_pins_resolve_to(tmp_path, bundle_home):
    from orchard.cli.main import app

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "harness-downloads").symlink_to(shared_downloads(), target_is_directory=True)
    done = CliRunner().invoke(app, ["harness", "lock", UNBUILT, "python-dateutil==2.9.0.post0",
                                    "--cache-dir", str(cache)])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [f"# orchard harness lock {UNBUILT} python-dateutil==2.9.0.post0",
                                        "python-dateutil==2.9.0.post0", "six==1.17.0"]
    assert sorted(p.name for p in cache.iterdir()) == ["harness-downloads"], "the throw-away build is removed"

def test_cli_lists_bundles_and_builds_by_name(bundle_home):
    from orchard.cli.main import app

    runner = CliRunner()
    cache = str(bundle_home / "cache")
    listed = runner.invoke(app, ["harness", "bundles", "--cache-dir", cache], env={"COLUMNS": "400"})  # one line a row
    assert listed.exit_code == 0, listed.output
    rows = {line.split("│")[1].strip(): line for line in listed.output.splitlines() if line.count("│") > 3}
    assert "built (" in rows[TINY] and f"not built: orchard harness build {UNBUILT}" in rows[UNBUILT]
    built = runner.invoke(app, ["harness", "build", TINY, "--cache-dir", cache], env={"COLUMNS": "200"})
    assert built.exit_code == 0 and "Python 3.13" in built.output and "1 distributions" in built.output
    unknown = runner.invoke(app, ["harness", "build", "nope", "--cache-dir", cache], env={"COLUMNS": "200"})
    assert unknown.exit_code == 1 and "unknown harness bundle 'nope'" in unknown.output
    neither = runner.invoke(app, ["harness", "build", "--cache-dir", cache])
    assert neither.exit_code == 2


# ---- the big ones ----------------------------------------------------------------------------------------

@pytest.mark.slow
async def test_kimi_cli_bundle_builds_and_runs_in_a_sandbox(tmp_path, bundle_home, busybox_rootfs):
    """kimi-cli 1.51.0 with ripgrep: ~350 MB; its CLI and rg run on a rootfs with neither Python nor libc."""
    cache = bundle_home / "cache"
    spec = get_bundle_spec("kimi-cli")
    ensure_bundle(spec, cache, downloads=shared_downloads())
    argv = " ".join(spec.entry_argv("--version"))
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=cache) as b:
        async with running(b, SandboxSpec(image=str(busybox_rootfs), bundles=["kimi-cli"])) as (_, agent):
            r = await agent.exec(f"{argv}; /.orchard/harness/kimi-cli/bin/rg --version | head -1", timeout=120)
            assert r.ok and "1.51.0" in r.stdout and "ripgrep" in r.stdout, (r.stdout, r.stderr)
    shutil.rmtree(b.root_dir, ignore_errors=True)


# ---- other backends --------------------------------------------------------------------------------------

@pytest.mark.docker
async def test_the_docker_backend_mounts_the_bundle_read_only(short_tmp, bundle_home):
    """The same bundle, bound from this machine's cache into a container of the Debian test image."""
    from tests.docker_daemon import TEST_IMAGE, require_daemon

    base_url = require_daemon()
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.backends.docker import DockerBackend
    from orchard.sandbox.backends.docker.config import DockerConfig

    backend = DockerBackend(DockerConfig(base_url=base_url, instance=f"t{secrets.token_hex(4)}", pull="never",
                                         run_dir=short_tmp / "run", bundle_cache_dir=bundle_home / "cache"))
    assert backend.capabilities.harness_bundles
    token = secrets.token_hex(16)
    with pytest.raises(InvalidRequest, match="not built on this server"):
        await backend.create("hb0", SandboxSpec(image=TEST_IMAGE, bundles=[UNBUILT]), token)
    sb = await backend.create("hb1", SandboxSpec(image=TEST_IMAGE, bundles=[TINY]), token)
    agent = AgentSandbox(sb.id, sb.agent_url, token)
    try:
        r = await agent.exec(PROBE)
        _check_probe(r.stdout, r.stderr)
    finally:
        await agent.close()
        await backend.delete(sb)
        assert await backend.list_live() == []
        await backend.close()


# ---- docs/harness-bundles.md -----------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "harness-bundles.md"


def test_docs_python_examples_print_what_their_comments_say(bundle_home, capsys):
    import contextlib
    import io

    from tests import doc_blocks

    for _, code, line in doc_blocks.of_kind(DOC, "python"):
        expected = [c.split("#", 1)[1].strip() for c in code.splitlines() if c.startswith("print(") and "#" in c]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{DOC.name}:{line}", "exec"), {})
        assert printed.getvalue().splitlines() == expected, f"{DOC.name}:{line}"


def test_docs_cli_and_shell_lines_name_what_exists():
    from tests import doc_blocks

    doc_blocks.check_cli_lines(DOC)
    doc_blocks.check_shell_lines(DOC)


def test_docs_layout_is_a_real_bundle_and_the_entry_point_group_is_ours(bundle_home):
    import tomllib

    from orchard.core.harness_bundle import BUNDLE_ENTRY_POINT_GROUP
    from tests import doc_blocks

    built, = require_built([TINY], bundle_home / "cache")
    (_, layout, _), = doc_blocks.of_kind(DOC, "layout")
    for path in layout.split():
        assert os.path.lexists(built.path / path), path
    (_, toml, _), = doc_blocks.of_kind(DOC, "toml")
    assert list(tomllib.loads(toml)["project"]["entry-points"]) == [BUNDLE_ENTRY_POINT_GROUP]


@pytest.mark.k8s
async def test_kubernetes_copies_the_bundle_from_its_injector_image(bundle_home):
    """The tiny bundle imported into the dev cluster as an injector image, copied by an init container into
    an emptyDir mounted read-only in a busybox Pod (no Python, no libc); unknown names are refused before
    any object exists, a bundle whose image the cluster lacks fails the create by the image's name."""
    from orchard.sandbox.agent_client import AgentSandbox
    from orchard.sandbox.backends.kubernetes.images import import_injector_image
    from orchard.sandbox.backends.kubernetes import KubernetesBackend
    from orchard.sandbox.backends.kubernetes.harness_images import import_harness_image
    from tests.k8s_cluster import CLUSTER_SCRIPT, delete_namespace, require_cluster

    kubeconfig = require_cluster()
    built, = require_built([TINY], bundle_home / "cache")
    agent_image = import_injector_image(CLUSTER_SCRIPT)
    assert import_harness_image(CLUSTER_SCRIPT, built).startswith(f"localhost/orchard-harness-{TINY}:")
    namespace = f"orchard-test-{secrets.token_hex(3)}"
    backend = KubernetesBackend(namespace=namespace, instance=f"t{secrets.token_hex(4)}", agent_image=agent_image,
                                image_pull_policy="Never", kubeconfig=kubeconfig)
    token = secrets.token_urlsafe(16)
    try:
        assert backend.capabilities.harness_bundles
        with pytest.raises(InvalidRequest, match="unknown harness bundle 'nope'"):
            await backend.create("hb-unknown", SandboxSpec(image="localhost/orchard-base:local", bundles=["nope"]),
                                 token)
        with pytest.raises(InvalidRequest, match=f"orchard-harness-{UNBUILT}.* is not available"):
            await backend.create("hb-missing", SandboxSpec(image="localhost/orchard-base:local",
                                                           bundles=[UNBUILT]), token)
        made = await backend.create("hb-tiny", SandboxSpec(image="localhost/orchard-base:local", bundles=[TINY]),
                                    token)
        async with AgentSandbox(made.id, made.agent_url, token) as agent:
            r = await agent.exec(PROBE)
            _check_probe(r.stdout, r.stderr)
        await backend.delete(made)
        assert await backend.list_live() == []
    finally:
        await backend.close()
        delete_namespace(kubeconfig, namespace)
