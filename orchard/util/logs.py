"""Logging setup for Orchard's servers (orchestrator, gateway)."""

from __future__ import annotations

import logging


def log_to_stderr(level: str) -> None:
    """uvicorn configures only its own loggers; show Orchard's (reconcile, reaping, gateway) the same way."""
    logger = logging.getLogger("orchard")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
