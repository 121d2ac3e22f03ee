"""Finding the Docker daemon the `docker` tests run against: $DOCKER_HOST, else the daemon of
scripts/docker/daemon.sh (its socket in ${ORCHARD_DOCKER_DIR:-~/.orchard/docker}), else the system's. Without
a daemon that answers the tests are skipped, unless ORCHARD_DOCKER=1 says one must be there: then they
fail. The sandbox image is the one `daemon.sh image` builds (ORCHARD_DOCKER_TEST_IMAGE to use another
with python3 in it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DAEMON_SCRIPT = REPO / "scripts" / "docker" / "daemon.sh"
TEST_IMAGE = os.environ.get("ORCHARD_DOCKER_TEST_IMAGE") or "localhost/orchard-debian:bookworm"


def base_url() -> str:
    from orchard.sandbox.backends.docker.config import default_base_url
    return os.environ.get("DOCKER_HOST") or default_base_url(os.environ)


def _unavailable() -> str | None:
    """Why the daemon (or the test image on it) cannot be used; None when it can."""
    try:
        import docker
    except ImportError as e:
        return f"the docker SDK is not installed ({e}); pip install -e '.[docker]'"
    url = base_url()
    try:
        api = docker.APIClient(base_url=url, version="auto", timeout=10)
    except docker.errors.DockerException as e:
        return f"no Docker daemon answers at {url} ({e})"
    try:
        api.inspect_image(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        return f"the daemon at {url} has no image {TEST_IMAGE}; build it with `{DAEMON_SCRIPT} image`"
    finally:
        api.close()
    return None


def require_daemon() -> str:
    """The daemon's base URL; skips (or, with ORCHARD_DOCKER=1, fails) when it is not usable."""
    reason = _unavailable()
    if reason is None:
        return base_url()
    if os.environ.get("ORCHARD_DOCKER") == "1":
        pytest.fail(f"ORCHARD_DOCKER=1 but the Docker daemon cannot be used: {reason}", pytrace=False)
    pytest.skip(f"{reason}; start one with `{DAEMON_SCRIPT} up` (and `image`) or set ORCHARD_DOCKER=1 to "
                "require it")
