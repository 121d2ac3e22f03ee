"""Orchard's own generic tool-calling harness (bash, view, create, str_replace, submit)."""

from orchard.harnesses.react.config import ReActConfig
from orchard.harnesses.react.harness import ReActHarness

__all__ = ["ReActConfig", "ReActHarness"]
