"""How an adapter keeps the end of its agent's run its own to report: it stops the agent a margin before the
evaluator's deadline (`ModelConfig.deadline`), and after its own stop it reads what the agent left only for
as long as the deadline allows.

The margin is what a stop and the reading after it take on a busy machine: killing a process group and
answering, then copying the agent's logs out of the sandbox and converting them. That work does not shrink
with a short deadline, so the margin has a floor (MARGIN_FLOOR_S) plus a share of the time left for the logs
a longer run writes, capped (MARGIN_CAP_S); and it is never more than half the time left, so that a budget
shorter than twice the floor still gives the agent half of it (rather than stopping it before it starts). Measured on a 2-core host (the agent phase's length against
the driver's limit), quiet and with two CPU hogs beside the tests: an OpenHands driver's kill and the reading
of its events took about 0.1 s either way; the floor leaves room for a far busier machine, a slower backend
and a long run's logs.

After the adapter's own stop fired, the rollout is the agent's `timeout` however the reading goes: what could
not be read in time (or could not be read at all) is said in the error, never turned into a sandbox error
(`after_stop`)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from orchard.core.errors import OrchardError
from orchard.core.harness import ModelConfig

MARGIN_FLOOR_S = 5.0  # a kill and the reading of the logs under load, with room to spare
MARGIN_SHARE = 0.05  # of the time left: the logs of a longer run take longer to read
MARGIN_CAP_S = 20.0
MARGIN_MAX_SHARE = 0.5  # of the time left: the agent keeps at least the other half
AFTER_STOP_RESERVE_S = 1.0  # what follows a stop ends this long before the deadline: the adapter returns first
MIN_RUN_S = 1.0

_T = TypeVar("_T")


def deadline_margin_s(time_left: float) -> float:
    """How long before the evaluator's deadline the agent is stopped: MARGIN_FLOOR_S plus MARGIN_SHARE of the
    time left, at most MARGIN_CAP_S and at most half the time left (30 s left: 6.5 s; 5 minutes or more:
    20 s; 4 s: 2 s)."""
    left = max(0.0, time_left)
    return min(MARGIN_CAP_S, MARGIN_FLOOR_S + MARGIN_SHARE * left, MARGIN_MAX_SHARE * left)


def run_limit_s(model: ModelConfig, own: float | None = None, default: float | None = None) -> float | None:
    """The agent's wall-time limit: the time left before the deadline less its margin (at least MIN_RUN_S),
    or the harness's `own` limit when sooner; without a deadline, `own` or else `default`."""
    left = model.time_left_s()
    if left is None:
        return own if own is not None else default
    limit = max(MIN_RUN_S, left - deadline_margin_s(left))
    return limit if own is None else min(limit, own)


async def after_stop(model: ModelConfig, work: Callable[[], Awaitable[_T]]) -> tuple[_T | None, str | None]:
    """`work()` (reading or keeping the agent's logs) once the adapter's own stop fired, bounded by the
    deadline less AFTER_STOP_RESERVE_S: (its value, None), or (None, why not) when it ran out of time or the
    sandbox failed it. The caller records the rollout as the agent's timeout either way, the reason in its
    error."""
    left = model.time_left_s()
    try:
        async with asyncio.timeout(None if left is None else max(0.0, left - AFTER_STOP_RESERVE_S)):
            return await work(), None
    except TimeoutError:
        return None, "its logs could not be copied out before the evaluator's deadline"
    except OrchardError as exc:
        return None, f"its logs could not be copied out: {exc.code}: {exc}"
