"""Fixtures shared by test modules."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchard.sandbox.bundle import ensure_agent_bundle
from tests.harness_bundle_rig import SessionBundles
from tests.harness_rig import gateway_in_front_of, scripted_model
from tests.k8s_cluster import CLUSTER_SCRIPT, require_cluster
from tests.local_backend_rig import local_backend, make_busybox_rootfs
from tests.running_server import remove_live_sandboxes


def pytest_configure(config):
    config.addinivalue_line("markers", "docker: needs a real Docker daemon (ORCHARD_DOCKER=1, or the one of "
                                       "scripts/docker/daemon.sh running)")


@pytest.fixture(scope="module")
def scripted():
    """The scripted OpenAI-compatible server (a stand-in for the model only), one per test module."""
    with scripted_model() as model:
        yield model


@pytest.fixture(scope="module")
def gateway(scripted):
    """Orchard's real gateway in front of the scripted server."""
    with gateway_in_front_of(scripted) as gw:
        yield gw


@pytest.fixture(scope="session")
def bundle_cache(tmp_path_factory) -> Path:
    """A cache holding the agent bundle, built once for the session: the local backend's tests start their
    sandboxes from it (none of them changes it)."""
    cache = tmp_path_factory.mktemp("bundle-cache")
    ensure_agent_bundle(cache)
    return cache


@pytest.fixture
async def backend(tmp_path, bundle_cache):
    """A local backend on the test's temporary directory; what a failed test left running is deleted.
    (Modules of the other backends define a `backend` of their own.)"""
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache) as made:
        yield made


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory) -> Path:
    """A rootfs with nothing but a static busybox and its applets: no Python, no libc. Tests must not
    change it (sandboxes write to an overlay of it)."""
    return make_busybox_rootfs(tmp_path_factory.mktemp("busybox-rootfs"))


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    """The `k8s` tests' cluster (tests/k8s_cluster.py): they skip without one."""
    return require_cluster()


@pytest.fixture(scope="session")
def agent_image(kubeconfig) -> str:
    """Build and import the agent-injector image for the current bundle (once per session)."""
    from orchard.sandbox.backends.kubernetes.images import import_injector_image
    return import_injector_image(CLUSTER_SCRIPT)


@pytest.fixture(scope="session")
def session_bundles(tmp_path_factory) -> SessionBundles:
    """The one harness-bundle cache of this test session: each bundle is built into it at most once, and
    every harness test module's Orchard home links its `cache` to it (tests/harness_bundle_rig.py).
    `ORCHARD_TEST_BUNDLE_CACHE` names one that sessions running side by side share (scripts/test.sh)."""
    shared = os.environ.get("ORCHARD_TEST_BUNDLE_CACHE")
    return SessionBundles(Path(shared) if shared else tmp_path_factory.mktemp("harness-bundles"))


@pytest.fixture
def sandbox_home(tmp_path):
    """A private state home for embedded sandboxes; whatever a failed test left running is removed."""
    directory = tmp_path / "home"
    directory.mkdir()
    yield directory
    remove_live_sandboxes(directory)


@pytest.fixture(scope="module")
def module_home(request, tmp_path_factory) -> Iterator[Path]:
    """One state home for a test module (the agent bundle cached there is built once, not per test);
    whatever it still runs afterwards is removed."""
    directory = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2] + "-home")
    yield directory
    remove_live_sandboxes(directory)


@pytest.fixture
def embedded_home(module_home, monkeypatch) -> Path:
    """The module's home as the embedded client's: ORCHARD_HOME names it, and no server is named."""
    monkeypatch.setenv("ORCHARD_HOME", str(module_home))
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    monkeypatch.delenv("ORCHARD_API_KEY", raising=False)
    return module_home


@pytest.fixture
def short_tmp():
    """A temporary directory with a short path, removed afterwards, for what holds Unix sockets: a socket's
    path is limited to 107 bytes, and `tmp_path` grows with pytest's run counter (machine-wide, never
    reset) and the test's name, so a socket under it fails once the counter has enough digits."""
    directory = Path(tempfile.mkdtemp(prefix="o-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
