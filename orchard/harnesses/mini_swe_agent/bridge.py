"""mini-swe-agent's loop is synchronous; Orchard's sandbox and model clients are async and bound to the
event loop the harness runs on. The agent runs in its own thread, and every sandbox or model call it makes
is handed back to that event loop (`LoopBridge.call`), where the clients live.

A dedicated thread per run (not the loop's default executor, which has only a few workers) lets many
rollouts run at once. Cancelling the harness stops the thread at its next call."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

POLL_INTERVAL_S = 0.2


class HarnessStopped(Exception):
    """The harness run was cancelled; the agent's thread stops at its next sandbox or model call."""


class LoopBridge:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._stopped = threading.Event()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the harness's loop and wait for its result (from the agent's thread)."""
        if self._stopped.is_set():
            coro.close()
            raise HarnessStopped("the harness run was cancelled")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:
            try:
                return future.result(timeout=POLL_INTERVAL_S)
            except concurrent.futures.TimeoutError:
                if self._stopped.is_set():
                    future.cancel()
                    raise HarnessStopped("the harness run was cancelled") from None

    def stop(self) -> None:
        self._stopped.set()


async def run_in_thread(function: Callable[[], T], bridge: LoopBridge, *, name: str) -> T:
    """`function()` in a new daemon thread; its result or exception comes back here. If this coroutine is
    cancelled, the bridge is stopped so the thread ends instead of working on unobserved."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        try:
            result, error = function(), None
        except BaseException as exc:  # everything goes back to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        return await done
    except asyncio.CancelledError:
        bridge.stop()
        raise
