"""The in-sandbox adapters' stop before the evaluator's deadline (orchard/harnesses/deadline.py): the margin
has a floor (a kill and the reading of the logs take seconds on a busy machine) unless that is more than half
the time left, and once the adapter's own stop fired, what follows it ends before the deadline and a sandbox
that fails it is a reason in the agent's timeout, not an error of its own. The work after a stop is a plain coroutine here:
what matters is how its end is bounded and classed; the adapters' real runs are in tests/test_harness_*.py."""

from __future__ import annotations

import asyncio

import pytest

from orchard.core.deadline import Deadline
from orchard.core.errors import SandboxLost
from orchard.core.harness import ModelConfig
from orchard.harnesses.deadline import (AFTER_STOP_RESERVE_S, MARGIN_CAP_S, MARGIN_FLOOR_S, after_stop,
                                        deadline_margin_s, run_limit_s)


def _model(deadline_in_s: float | None) -> ModelConfig:
    return ModelConfig(model="m", deadline=None if deadline_in_s is None else Deadline.after(deadline_in_s))


def test_the_margin_has_a_floor_a_share_and_a_cap():
    assert deadline_margin_s(30) == pytest.approx(6.5)  # a tenth of 30 s was 3 s: the floor holds
    assert deadline_margin_s(12) == pytest.approx(MARGIN_FLOOR_S + 0.6)
    assert deadline_margin_s(1800) == MARGIN_CAP_S
    # Under twice the floor the agent keeps half of what is left instead of being stopped before it starts.
    assert deadline_margin_s(4) == 2.0 and deadline_margin_s(1) == 0.5 and deadline_margin_s(0) == 0.0


def test_the_run_limit_is_the_time_left_less_the_margin_or_the_harness_own():
    assert run_limit_s(_model(None), None, 3600) == 3600 and run_limit_s(_model(None), 12, 3600) == 12
    assert run_limit_s(_model(30), None) == pytest.approx(23.5, abs=0.1)
    assert run_limit_s(_model(30), 10) == 10
    assert run_limit_s(_model(2), None) == 1.0  # never below a second


async def test_work_after_a_stop_ends_before_the_deadline_with_the_reason():
    model = _model(AFTER_STOP_RESERVE_S + 0.5)
    value, why = await after_stop(model, lambda: asyncio.sleep(60, result="never"))
    assert value is None and "before the evaluator's deadline" in why
    assert not model.deadline.expired


async def test_a_sandbox_failing_the_work_after_a_stop_is_a_reason_not_an_error():
    async def lost() -> None:
        raise SandboxLost("sandbox s-1 dropped the connection")

    value, why = await after_stop(_model(30), lost)
    assert value is None and why == "its logs could not be copied out: sandbox_lost: sandbox s-1 dropped the connection"
    assert await after_stop(_model(30), lambda: asyncio.sleep(0, result=7)) == (7, None)

    async def bug() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):  # the adapter's own bug is not hidden as a reading failure
        await after_stop(_model(30), bug)
