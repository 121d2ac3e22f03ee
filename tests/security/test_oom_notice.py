"""Without CAP_SYS_RESOURCE (a container that drops it, even as root) the local backend cannot exempt a
sandbox's workload init from the OOM killer. That is a property of the host, the same for every sandbox:
it is said once per process, with what it means for the user, never once per create. Real sandboxes; on a
host that has the capability, the refusal is made at the point where it is detected."""

from __future__ import annotations

import errno
import logging

from orchard.sandbox.backends.local import launch as local_launch
from tests.local_backend_rig import local_backend, running

CAP_SYS_RESOURCE = 24


def has_cap_sys_resource() -> bool:
    with open("/proc/self/status") as f:
        effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(effective >> CAP_SYS_RESOURCE & 1)


async def test_two_creates_say_the_missing_oom_exemption_once_and_what_it_means(tmp_path, bundle_cache, caplog,
                                                                                 monkeypatch):
    monkeypatch.setattr(local_launch, "_init_protection_warned", False)  # as in a fresh process
    if has_cap_sys_resource():
        def refused(pid: int) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(local_launch, "exempt_from_oom_killer", refused)
    caplog.set_level(logging.INFO, logger=local_launch.log.name)
    separated = []
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=bundle_cache,
                             image_dir=tmp_path / "images") as backend:
        for _ in range(2):
            async with running(backend) as (_, sandbox):
                separated.append((await sandbox.health()).get("workload_pid_namespace"))
    said = [r.getMessage() for r in caplog.records if "OOM killer" in r.getMessage()]
    assert len(said) <= 1, said
    if "separate" in separated:  # the workload has a pid namespace of its own: there is an init to exempt
        assert len(said) == 1, (separated, said)
        text = said[0]
        assert "CAP_SYS_RESOURCE" in text and "once per process" in text, text
        assert "every process of that sandbox ends and the sandbox is lost" in text, text  # what it means
