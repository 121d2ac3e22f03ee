"""The backend conformance suite (orchard/testing/conformance/) on the docker backend, against the daemon
of scripts/docker/daemon.sh (or DOCKER_HOST; skipped without one unless ORCHARD_DOCKER=1). Sandboxes run
the Debian image `daemon.sh image` builds; each orchestrator the suite starts gets an `instance` label of
its own."""

import secrets

import pytest

from orchard.sandbox.backends.registry import backend_config
from orchard.testing.conformance import BackendConformance
from tests.docker_daemon import TEST_IMAGE, require_daemon

pytestmark = pytest.mark.docker


class TestDockerBackend(BackendConformance):
    image = TEST_IMAGE

    @pytest.fixture(scope="class")
    def make_backend_config(self, tmp_path_factory):
        base_url = require_daemon()
        cache = tmp_path_factory.mktemp("bundle-cache")  # the agent bundle: built once, not per home
        return lambda home: backend_config(
            "docker", home, environ={}, base_url=base_url, instance=f"c{secrets.token_hex(4)}",
            bundle_cache_dir=cache, pull="never")
