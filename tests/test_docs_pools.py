"""docs/pools.md, every block checked: the Python example runs as written on the embedded local backend
(a real pool, a real claim), the pools file is a valid PoolsConfig, the command lines parse."""

from __future__ import annotations

import contextlib
import io

from tests import doc_blocks
from tests.running_server import live_sandbox_ids

PAGE = doc_blocks.ROOT / "docs" / "pools.md"


def test_the_example_claims_from_a_warm_pool(sandbox_home, monkeypatch):
    import asyncio

    monkeypatch.setenv("ORCHARD_HOME", str(sandbox_home))
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    ((_, code, line),) = doc_blocks.of_kind(PAGE, "python")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        doc_blocks.run_python(code, f"pools.md:{line}", {})
    claimed, claim_ms, seed, claims = printed.getvalue().split()
    assert (claimed, seed, claims) == ("True", "7", "1") and float(claim_ms) > 0
    assert asyncio.run(live_sandbox_ids(sandbox_home)) == set()


def test_the_pools_file_and_command_lines():
    (config,) = doc_blocks.check_data_blocks(PAGE, "yaml")
    assert config.pools[0].name == "swe" and config.pools[0].on_demand
    doc_blocks.check_cli_lines(PAGE)
