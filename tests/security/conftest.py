"""The security tests' running server: one `orchard serve` per module on a home of the module's own (its
sandboxes deleted afterwards), and an authenticated client of it. A module sets what its server is started
with by overriding `serve_options`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.security.serve_process import Serve, emptied_afterwards, serving


@pytest.fixture(scope="module")
def home(request, tmp_path_factory) -> Iterator[Path]:
    with emptied_afterwards(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])) as path:
        yield path


@pytest.fixture(scope="module")
def serve_options() -> dict[str, Any]:
    """Serve's keywords (`env`, `args`, `wrapper`) for the module's server."""
    return {}


@pytest.fixture(scope="module")
def server(home, serve_options) -> Iterator[Serve]:
    with serving(home, **serve_options) as running:
        yield running


@pytest.fixture
def api(server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client
