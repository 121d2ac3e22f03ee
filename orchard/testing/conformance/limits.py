"""Limits: max_processes and memory_mb hold, and the sandbox survives them."""

from __future__ import annotations

import contextlib

import pytest

from orchard.testing.conformance._rig import ConformanceRig, wait_until


class LimitChecks(ConformanceRig):
    def test_max_processes_caps_a_fork_loop(self, orchestrator):
        if "max_processes" not in orchestrator.backend.capabilities.limits:
            pytest.skip(f"the {orchestrator.backend.name} backend does not declare the max_processes limit")
        limit = self.max_processes
        # Each started process lives 5 s; the shell stops (or the timeout kills it) when a fork fails.
        loop = (f"n=0; while [ $n -lt {2 * limit} ]; do sleep 5 & n=$((n+1)); echo $n; done; "
                "echo all-started")
        with orchestrator.sandbox(self._spec_for(orchestrator, max_processes=limit)) as (_, sandbox):
            r = sandbox.exec(loop, timeout=60)
            assert "all-started" not in r.stdout, f"{2 * limit} processes started under max_processes={limit}"
            started = int(r.stdout.split()[-1]) if r.stdout.split() else 0
            assert started < limit

            def usable() -> bool:
                with contextlib.suppress(Exception):
                    return sandbox.exec("echo usable").stdout == "usable\n"
                return False

            wait_until(usable, "the sandbox to run commands again once the processes ended")

    def test_memory_limit_stops_a_hog_and_the_sandbox_survives(self, orchestrator):
        if "memory_mb" not in orchestrator.backend.capabilities.limits:
            pytest.skip(f"the {orchestrator.backend.name} backend does not declare the memory_mb limit")
        limit = self.memory_mb
        with orchestrator.sandbox(self._spec_for(orchestrator, memory_mb=limit)) as (_, sandbox):
            small = sandbox.exec("dd if=/dev/zero of=/dev/null bs=16M count=1 && echo fits", timeout=120)
            assert "fits" in small.stdout, small
            hog = sandbox.exec(f"dd if=/dev/zero of=/dev/null bs={4 * limit}M count=1 && echo survived",
                               timeout=120)
            assert hog.exit_code != 0 and "survived" not in hog.stdout, hog
            assert sandbox.exec("echo alive").stdout == "alive\n"
