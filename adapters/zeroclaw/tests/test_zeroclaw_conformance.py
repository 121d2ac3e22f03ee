"""Orchard's harness conformance suite (orchard.testing.harness_conformance) on the ZeroClaw profile, run as
`orchard eval` runs it: valid ATIF, every tool call paired with its result, the stop before the deadline,
token ids and logprobs reachable from every agent step, typed errors. Once on the profile, and once on the
real-binary path against the stand-in for the binary."""

import pytest
from zeroclaw_rig import STANDIN, home_with_cache

from orchard.testing.harness_conformance import HarnessConformance


class TestZeroClawProfile(HarnessConformance):
    harness = "zeroclaw"
    harness_options = {"binary": ""}  # the profile, even where ZEROCLAW_BIN names a binary
    deadline_s = 15.0


@pytest.mark.slow
class TestRealZeroClawOnTheStandIn(HarnessConformance):
    """The real-binary path (the driver in the sandbox, the relay, the frames read back) on the STAND-IN for the
    binary (zeroclaw_standin.py), which speaks ZeroClaw's gateway frames: ZeroClaw itself cannot be built here."""

    harness = "zeroclaw"
    harness_options = {"binary": str(STANDIN)}
    deadline_s = 30.0  # the driver starts in the sandbox, then the stand-in's gateway

    @pytest.fixture(scope="class")
    @classmethod
    def orchard_home(cls, tmp_path_factory, zeroclaw_cache):
        return home_with_cache(tmp_path_factory.mktemp("conformance-home"), zeroclaw_cache)
