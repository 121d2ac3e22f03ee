"""Kimi-CLI (PyPI `kimi-cli`), run inside the sandbox from its harness bundle (bundle.py): the `kimi-cli`
harness (harness.py, on the in-sandbox base) starts it with its config (config.py) and turns its session logs
into the Trajectory (convert.py)."""

from orchard.harnesses.kimi_cli.harness import KimiCliHarness

__all__ = ["KimiCliHarness"]
