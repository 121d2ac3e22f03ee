"""ZeroClaw for Orchard (`orchard eval --harness zeroclaw`): the ZeroClaw profile, a Python harness with
ZeroClaw's tools, prompt layout, history cap and delegated sub-agents, and the real ZeroClaw binary driven over
its gateway when one is given. See README.md."""

from orchard_zeroclaw.harness import ZeroClawHarness
from orchard_zeroclaw.version import PROFILE_VERSION

__all__ = ["PROFILE_VERSION", "ZeroClawHarness"]
