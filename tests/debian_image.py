"""The project's own Debian image for tests on the local backend: the bookworm tree that
scripts/docker/image.sh debootstraps for the docker tests (git, python3 as `python`, pytest; cached as a
one-layer OCI archive in the docker work dir), imported into a test's Orchard home under the names Harbor's
tasks use for Debian, `debian:bookworm` and `debian:bookworm-slim`. The import takes a few seconds; without
the archive the tests that need it skip (or, with ORCHARD_DEBIAN=1, fail), saying how to build it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docker_daemon import DAEMON_SCRIPT

NAMES = ("debian:bookworm", "debian:bookworm-slim")
ARCHIVE_NAME = "localhost_orchard-debian_bookworm.oci.tar"


def archive() -> Path:
    """Where scripts/docker/image.sh caches the archive (ORCHARD_DOCKER_DIR, default ~/.orchard/docker)."""
    workdir = Path(os.environ.get("ORCHARD_DOCKER_DIR") or Path.home() / ".orchard" / "docker")
    return workdir / "cache" / "images" / ARCHIVE_NAME


def import_debian(home: Path) -> None:
    """Import the archive into `home`'s image store under NAMES; skips (or fails) when there is none."""
    from orchard.sandbox.backends.local.bwrap import image_ids
    from orchard.sandbox.images import ImageStore

    path = archive()
    if not path.is_file():
        reason = f"no Debian image archive at {path}; build it with `{DAEMON_SCRIPT} image`"
        if os.environ.get("ORCHARD_DEBIAN") == "1":
            pytest.fail(f"ORCHARD_DEBIAN=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    store = ImageStore(home / "images")
    for name in NAMES:
        store.import_archive(path, name=name, ids=image_ids())
