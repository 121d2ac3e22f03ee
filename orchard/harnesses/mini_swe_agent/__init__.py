"""The real mini-swe-agent package (PyPI `mini-swe-agent`) as an Orchard harness: its DefaultAgent loop and
config files, with an Environment on the Orchard sandbox and a Model that calls through the gateway."""

import os

# The package prints a banner on import unless told not to; harness runs are not interactive.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from orchard.harnesses.mini_swe_agent.harness import MiniSweAgentHarness  # noqa: E402

__all__ = ["MiniSweAgentHarness"]
