"""The local backend's three start paths (local/start.py: bwrap running the agent, the zygote forking it, a
spare's shell starting bwrap) leave this process's descriptors as they found them: after a create that
succeeds, one that fails before it reads bwrap's report (nothing it holds was taken yet) and one that fails
at the agent's /health (everything was). What a create holds is closed by its ExitStacks, whichever way it
ends.

Real sandboxes: bwrap, cgroups; the zygote's paths as root, the spare's on cgroup v1 too."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections import Counter

import pytest

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.backends.local import backend as backend_module
from orchard.sandbox.backends.local import LocalBackend
from tests import local_backend_rig as rig


PATHS = {
    "plain": ({"zygote": False}, None),
    "zygote": ({"zygote": True, "spares": 0}, "the zygote runs as root only"),
    "spare": ({"zygote": True, "spares": 1}, "spares: root, on cgroup v1"),
}


def open_descriptors() -> Counter:
    """What this process's descriptors are, by kind (a pipe, a socket, a memory file, a path): the numbers
    and inodes of what the backend keeps (the zygote's socket, a spare's pipes) change between creates."""
    kinds = Counter()
    for number in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{number}")
        except OSError:
            continue  # the listing's own descriptor, gone
        kinds[target.split(":[")[0] if ":[" in target else target] += 1
    return kinds


def held_more(before: Counter, after: Counter) -> Counter:
    """The kinds of descriptor this process holds more of than before (Counter subtraction keeps only what
    grew): a create that leaks shows here. Fewer is not a leak: the descriptors are the whole process's, and
    connections earlier tests of the session left open may close meanwhile (a server's idle timeout)."""
    return after - before


async def settled(backend: LocalBackend) -> Counter:
    """The descriptors once the backend has what it keeps between creates (its spare made again), the pipe
    transports a create closed are closed (the event loop does it on its next turn) and garbage is collected."""
    deadline = time.monotonic() + 15
    while backend._zygote is not None and backend.spares and backend._spares.off_reason is None:
        if len(backend._spares._ready) >= backend.spares and backend._spares._making is None:
            break
        assert time.monotonic() < deadline, "no spare was made again"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.01)
    gc.collect()
    return open_descriptors()


@pytest.fixture(params=list(PATHS))
async def backend(request, tmp_path, short_tmp, bundle_cache):
    options, needs = PATHS[request.param]
    if needs and os.geteuid() != 0:
        pytest.skip(needs)
    if request.param == "spare" and not rig.cgroup_v1_only():
        pytest.skip(needs)
    async with rig.local_backend(tmp_path / "sandboxes", run_dir=short_tmp / "run", bundle_cache_dir=bundle_cache,
                                 **options) as made:
        async with rig.running(made) as (_, agent):  # the zygote started, the first spare made
            assert (await agent.exec("echo warm")).stdout == "warm\n"
        if request.param == "spare":
            await settled(made)
            assert made._spares.off_reason is None and made._spares._ready, "no spare to start from"
        yield made


async def test_a_create_that_succeeds_closes_what_it_held(backend):
    before = await settled(backend)
    async with rig.running(backend) as (_, agent):
        assert (await agent.exec("echo up")).stdout == "up\n"
    assert not held_more(before, await settled(backend))


@pytest.mark.parametrize("failing", ["read_info", "check_health"])
async def test_a_create_that_fails_closes_what_it_held(backend, monkeypatch, failing):
    before = await settled(backend)

    async def fails(first, *args, **kwargs):
        if failing == "read_info":
            os.close(first)  # as read_info does, whatever it finds
        raise BackendError(f"{failing} failed on purpose")

    monkeypatch.setattr(backend_module, failing, fails)
    with pytest.raises(BackendError, match="failed on purpose"):
        await backend.create("fails", SandboxSpec(), "tok")
    monkeypatch.undo()
    assert list(backend.root_dir.iterdir()) == []
    assert not held_more(before, await settled(backend))
    async with rig.running(backend) as (_, agent):  # and the next create works
        assert (await agent.exec("echo fine")).stdout == "fine\n"
