"""The fixtures of the adapter's tests (the helpers are in zeroclaw_rig.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from zeroclaw_rig import build_cache


@pytest.fixture(scope="session")
def zeroclaw_cache(tmp_path_factory) -> Path:
    """One cache for the session holding the `zeroclaw` harness bundle, built once."""
    return build_cache(tmp_path_factory.mktemp("zeroclaw-cache"))
