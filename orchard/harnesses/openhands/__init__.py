"""The OpenHands SDK (PyPI `openhands-sdk`, `openhands-tools`) as a harness that runs inside the sandbox from
its harness bundle (bundle.py): the adapter (harness.py) ships a driver (driver.py) that the bundle's Python
runs, and turns the SDK's persisted events into the trajectory (convert.py)."""

from orchard.harnesses.openhands.harness import OpenHandsHarness

__all__ = ["OpenHandsHarness"]
