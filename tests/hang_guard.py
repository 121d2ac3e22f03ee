"""A guard against a hang, not a speed check: tests assert what a call did, and a bound on wall-clock time
belongs in the benchmarks (bench/). The bound here is generous; it only turns a call that never returns into
a failure that says so, before pytest's own timeout kills the whole module."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

HANG_S = 120.0


async def returns(awaitable: Awaitable[T], what: str, *, within_s: float = HANG_S) -> T:
    """Await `awaitable`; fail if it is still running after `within_s` (its own exceptions pass through)."""
    try:
        async with asyncio.timeout(within_s) as guard:
            return await awaitable
    except TimeoutError:
        if guard.expired():
            raise AssertionError(f"{what} did not return within {within_s:.0f} s: it hangs") from None
        raise
