"""The orchestrator's home holds the state db with every live sandbox's token. `orchard serve --home X` with X
not `$ORCHARD_HOME`: a sandbox on the host image (which sees the host's directories read-only) must not
list or read X. Before, only `$ORCHARD_HOME` (and the sandboxes, cache and images directories) were
covered, so X itself and its state db showed through wherever the file modes let the sandbox's user in:
a home of root's owned by another account, or any home of an orchestrator not run by root (its sandboxes
run as its own uid)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.server.home import state_db_path
from tests.security.serve_process import MARK, Serve, remove_everything

# The home must be somewhere the host image shows: a sandbox gets /tmp and /run of its own.
SHOWN_PARENT = Path("/var/tmp")


@pytest.fixture
def home(tmp_path) -> Iterator[Path]:
    SHOWN_PARENT.mkdir(mode=0o1777, parents=True, exist_ok=True)  # the FHS's; made where a host lacks it
    path = Path(tempfile.mkdtemp(prefix="orchard-home-test-", dir=SHOWN_PARENT))
    os.chmod(path, 0o755)
    if os.geteuid() == 0:
        # Not root's own: the orchestrator leaves its mode alone (it tightens only its own directories),
        # as for a home an operator made for a service account.
        os.chown(path, 1000, 1000)
    try:
        yield path
    finally:
        remove_everything(path)
        shutil.rmtree(path, ignore_errors=True)


async def test_a_host_image_sandbox_cannot_list_or_read_a_home_given_with_dash_dash_home(home, tmp_path):
    elsewhere = tmp_path / "orchard-home-env"  # what $ORCHARD_HOME says: not the home this server uses
    server = Serve(home, env={"ORCHARD_HOME": str(elsewhere)}, args=["--home", str(home)]).wait_up()
    try:
        with server.client() as api:
            made = api.post("/v1/sandboxes", json={"image": "host", "env": {MARK: "home"}})
            assert made.status_code == 201, made.text
            info = made.json()
        db = state_db_path(home)
        assert db.is_file()
        async with AgentSandbox(info["id"], info["agent_url"], info["token"]) as sandbox:
            listed = await sandbox.exec(["ls", "-A", str(home)])
            read = await sandbox.exec(["head", "-c", "100", str(db)])
        assert listed.ok and listed.stdout.strip() == "", listed  # an empty directory: the cover
        assert not read.ok and "SQLite" not in read.stdout and "No such file" in read.stderr, read
    finally:
        server.stop()
