"""The client side of the chaos tests: workers that run create → exec → (file round trip) → delete cycles
against an orchestrator as fast as they can, and the tally of what happened to them.

Errors during chaos are expected, but only Orchard's own typed errors with a message a user can act on;
anything else, and any call that does not return within its limit (a hang), is a failure the test reports."""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

from orchard.core.errors import NotFound, OrchardError
from orchard.sandbox.client import AsyncOrchard

T = TypeVar("T")

CALL_LIMIT_S = 60.0  # no single call may take longer: past it, it is a hang
RETRY_PAUSE_S = 0.1


class Hang(Exception):
    """A call did not return within CALL_LIMIT_S."""


@dataclass
class Tally:
    cycles_ok: int = 0
    cycles_failed: int = 0
    errors: Counter = field(default_factory=Counter)  # "Type: message start" -> count
    examples: dict[str, str] = field(default_factory=dict)  # kind -> the first whole message of that kind
    unexpected: list[str] = field(default_factory=list)  # not an OrchardError, or an unclear one
    hangs: list[str] = field(default_factory=list)
    wrong_answers: list[str] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)
    create_s: list[float] = field(default_factory=list)  # successful creates, end to end
    slowest_create: tuple[float, str] = (0.0, "")  # seconds, sandbox id

    def record(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, Hang):
            self.hangs.append(f"{what}: {exc}")
        elif not isinstance(exc, OrchardError):
            self.unexpected.append(f"{what}: {''.join(traceback.format_exception(exc))[-1500:]}")
        elif len(str(exc)) < 20 or str(exc).rstrip().endswith(":") or "()" in str(exc):
            # too short to say anything, or a cause left out ("...: " with nothing after it)
            self.unexpected.append(f"{what}: {type(exc).__name__} with an unclear message {str(exc)!r}")
        else:
            kind = f"{type(exc).__name__}: {_shape(str(exc))}"
            self.errors[kind] += 1
            self.examples.setdefault(kind, f"{what}: {exc}")

    def summary(self) -> str:
        times = sorted(self.create_s) or [0.0]
        lines = [f"cycles ok {self.cycles_ok}, failed {self.cycles_failed}, sandboxes {len(self.seen_ids)}; "
                 f"create p50 {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s ({self.slowest_create[1]})"]
        lines += [f"  {n:5d} x {kind}" for kind, n in self.errors.most_common()]
        return "\n".join(lines)

    def example_messages(self) -> str:
        return "\n".join(f"  {example[:400]}" for example in self.examples.values())


def _shape(message: str) -> str:
    """The message with ids and numbers blurred, so that errors of one kind count together."""
    words = []
    for word in message.split()[:14]:
        if word.startswith("sb-") or any(c.isdigit() for c in word):
            word = "#"
        words.append(word)
    return " ".join(words)


async def bounded(call: Awaitable[T], what: str) -> T:
    try:
        return await asyncio.wait_for(call, CALL_LIMIT_S)
    except asyncio.TimeoutError:
        raise Hang(f"{what} did not return within {CALL_LIMIT_S:g} s") from None


async def delete_until_gone(orch: AsyncOrchard, sandbox_id: str, tally: Tally, stop_at: float) -> bool:
    """What a careful client does with a sandbox it is done with: delete it, retrying through an
    orchestrator's outage. False if `stop_at` came first (the final sweep then deletes it)."""
    while True:
        try:
            await bounded(orch.delete(sandbox_id), f"delete {sandbox_id}")
            return True
        except NotFound:
            return True
        except Exception as exc:  # noqa: BLE001 — every failure is tallied and judged by the test
            tally.record("delete", exc)
            if isinstance(exc, Hang) or time.monotonic() > stop_at:
                return False
            await asyncio.sleep(RETRY_PAUSE_S)


async def one_cycle(orch: AsyncOrchard, rng: random.Random, spec: dict[str, Any], tally: Tally,
                    stop_at: float, hold_s: tuple[float, float] = (0.0, 0.0)) -> bool:
    """One create → use → delete; False when the create failed (nothing to use). Between the exec and the
    file round trip the sandbox is held for a time drawn from `hold_s`."""
    began = time.monotonic()
    try:
        sandbox = await bounded(orch.create(**spec), "create")
    except Exception as exc:  # noqa: BLE001
        tally.record("create", exc)
        tally.cycles_failed += 1
        await asyncio.sleep(RETRY_PAUSE_S)  # the orchestrator may be restarting
        return False
    tally.seen_ids.add(sandbox.id)
    tally.create_s.append(time.monotonic() - began)
    tally.slowest_create = max(tally.slowest_create, (tally.create_s[-1], sandbox.id))
    ok = False
    try:
        word = f"w{rng.getrandbits(32):x}"
        result = await bounded(sandbox.exec(f"echo {word}", timeout=30), "exec")
        if result.stdout != f"{word}\n":
            tally.wrong_answers.append(f"{sandbox.id}: echo {word} gave {result.stdout!r}")
        if hold_s[1] > 0:
            await asyncio.sleep(rng.uniform(*hold_s))
        if rng.random() < 0.3:
            data = rng.randbytes(rng.randint(0, 4096))
            await bounded(sandbox.write_file("chaos.bin", data), "write_file")
            if await bounded(sandbox.read_file("chaos.bin"), "read_file") != data:
                tally.wrong_answers.append(f"{sandbox.id}: read_file gave other bytes than were written")
        ok = True
    except Exception as exc:  # noqa: BLE001
        tally.record("use", exc)
    finally:
        deleted = await delete_until_gone(orch, sandbox.id, tally, stop_at)
        await sandbox.close()
        if ok and deleted:
            tally.cycles_ok += 1
        else:
            tally.cycles_failed += 1
    return True


async def run_workers(make_client: Callable[[], AsyncOrchard], specs: list[dict[str, Any]], *, workers: int,
                      cycles: int, stop_at: float, seed: int, tally: Tally,
                      hold_s: tuple[float, float] = (0.0, 0.0)) -> None:
    """`workers` loops (worker i creates with `specs[i % len(specs)]`) sharing a budget of `cycles` sandboxes (creates that failed, e.g. while the
    orchestrator was down, do not spend it), until it is spent or `stop_at` (monotonic) passes."""
    left = [cycles]

    async def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        spec = specs[index % len(specs)]
        async with make_client() as orch:
            while time.monotonic() < stop_at and left[0] > 0:
                if await one_cycle(orch, rng, spec, tally, stop_at + 30, hold_s):
                    left[0] -= 1

    await asyncio.gather(*(worker(i) for i in range(workers)))
