"""Limits that cannot be enforced are refused at create, never silently weakened; specs past what the
machine has are refused by the server's maxima. Performed against a real `orchard serve` and the real
local backend (cgroups, bubblewrap)."""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from typing import Iterator

import pytest

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local import cgroups
from tests.security.serve_process import (MARK, Serve, assert_refused, leftovers, local_backend, marked_pids,
                                          server_on_a_home_of_its_own, wait_for)



def _cgroups_usable() -> bool:
    made = cgroups.create_cgroups(f"probe{secrets.token_hex(4)}", SandboxSpec(max_processes=8))
    if made is None:
        return False
    cgroups.remove_cgroups(made.paths)
    return {"memory", "pids", "cpu"} <= set(made.controllers)


needs_cgroups = pytest.mark.skipif(not _cgroups_usable(), reason="needs writable memory/pids/cpu cgroups")
needs_root_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                        reason="hiding cgroups needs root and unshare (util-linux)")


@pytest.fixture(scope="module")
def serve_options() -> dict:
    """Machine-derived maxima, except memory which the operator set to 512 MiB (`home`, `server` and `api`
    are conftest.py's)."""
    return {"env": {"ORCHARD_MAX_MEMORY_MB": "512"}}


# --- the server's maxima -------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, why", [
    ("cpu", 1e9, "CPU cores"),
    ("disk_mb", 2 ** 40, "tmpfs"),
    ("max_processes", 2 ** 40, "pid_max"),
    ("timeout_s", 1e12, "TTL"),
    ("heartbeat_timeout_s", 1e12, "TTL"),
])
def test_specs_past_the_machine_are_refused(api, field, value, why):
    message = assert_refused(api.post("/v1/sandboxes", json={field: value}), field, "maximum", why)
    assert "--max-" in message and "ORCHARD_MAX_" in message


def test_the_operator_sets_a_maximum(api):
    assert_refused(api.post("/v1/sandboxes", json={"memory_mb": 513}), "memory_mb=513", "512",
                   "set by the operator", "ORCHARD_MAX_MEMORY_MB")


def test_a_bad_maximum_stops_serve_with_a_clear_message(tmp_path):
    server = Serve(tmp_path, args=["--max-cpu", "lots"])
    assert server.process.wait(timeout=60) == 2
    assert "cpu" in server.log.read_text() and "'none'" in server.log.read_text()


@needs_cgroups
def test_a_spec_within_the_maxima_gets_its_limits(api):
    mark = uuid.uuid4().hex
    created = api.post("/v1/sandboxes", json={"cpu": 0.5, "memory_mb": 256, "max_processes": 64,
                                              "env": {MARK: mark}})
    assert created.status_code == 201, created.text
    api.delete(f"/v1/sandboxes/{created.json()['id']}")
    wait_for(lambda: not marked_pids(mark), 10, "the sandbox's processes to be gone")


# --- the backend never weakens a limit -----------------------------------------------------------------


@needs_cgroups
@pytest.mark.parametrize("fields, named", [
    ({"cpu": 1e9}, "cpu=1e+09"),                      # past the kernel's largest CFS quota: EINVAL
    ({"max_processes": 2 ** 40}, "max_processes"),    # past PID_MAX_LIMIT: EINVAL
    ({"cpu": 0.001}, "cpu=0.001"),                    # under the smallest quota: used to be raised silently
])
async def test_a_limit_the_kernel_refuses_is_an_error_and_leaves_nothing(tmp_path, fields, named):
    """Straight to the backend (no server maxima in front): it used to fall back to rlimits here, with no
    memory limit at all, while the spec still showed what was asked."""
    backend = local_backend(tmp_path)
    sandbox_id = f"lim{secrets.token_hex(4)}"
    with pytest.raises(InvalidRequest) as refused:
        await backend.create(sandbox_id, SandboxSpec(memory_mb=128, **fields), "tok")
    assert named in str(refused.value) and "enforced" in str(refused.value)
    assert leftovers(tmp_path, {sandbox_id}) == []
    assert await backend.list_live() == []


# --- no cgroups at all ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_without_cgroups(tmp_path_factory) -> Iterator[Serve]:
    """`orchard serve` in a private mount namespace where no cgroup hierarchy is mounted: what an
    orchestrator without access to cgroups sees."""
    hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'umount -R /sys/fs/cgroup 2>/dev/null || umount -l /sys/fs/cgroup; exec "$@"', "hide-cgroups"]
    with server_on_a_home_of_its_own(tmp_path_factory, "sec-nocg", wrapper=hide) as running:
        yield running


@needs_root_unshare
@pytest.mark.parametrize("fields, named", [
    ({"memory_mb": 256, "max_processes": None}, "memory_mb=256"),
    ({"cpu": 1, "max_processes": None}, "cpu=1"),
    ({}, "max_processes=512"),  # the default; RLIMIT_NPROC does not bind root
])
def test_without_cgroups_limits_are_refused_not_downgraded(server_without_cgroups, fields, named):
    with server_without_cgroups.client() as api:
        assert_refused(api.post("/v1/sandboxes", json=fields), named, "cannot be enforced", "cgroups")
        assert api.get("/v1/sandboxes").json()["sandboxes"] == []


@needs_root_unshare
def test_without_cgroups_a_spec_without_limits_still_runs(server_without_cgroups):
    mark = uuid.uuid4().hex
    with server_without_cgroups.client() as api:
        created = api.post("/v1/sandboxes", json={"max_processes": None, "env": {MARK: mark}})
        assert created.status_code == 201, created.text
        api.delete(f"/v1/sandboxes/{created.json()['id']}")
    wait_for(lambda: not marked_pids(mark), 10, "the sandbox's processes to be gone")
