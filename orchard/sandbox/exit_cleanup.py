"""Deleting embedded sandboxes when the process ends without closing its client.

Embedded sandboxes live only as long as the process that runs their orchestrator, so every way out of the
process should delete them:
- normal return, exceptions, Ctrl-C (SIGINT → KeyboardInterrupt, or cancellation under `asyncio.run`):
  the `with` / `async with` blocks (`finally`) close the client, which deletes its sandboxes;
- SIGTERM: Python's default is to die on the spot, running no `finally` and no `atexit`. While an
  embedded client is open, and only if nobody else handles SIGTERM (the handler is still the default) and
  we are on the main thread, SIGTERM is turned into `SystemExit(143)` so the same unwinding runs. The
  default is restored when the last embedded client closes. A process that installs its own SIGTERM
  handler keeps it and is responsible for closing its clients;
- an `AsyncOrchard` that was never closed: closed when its event loop shuts down (`asyncio.run` ends) or
  when it is garbage collected, on that loop (see `AsyncOrchard._closes_with_its_loop`);
- any client still open at interpreter exit (e.g. a sync `Orchard`, whose loop thread runs until then):
  a hook at interpreter shutdown closes it (on its own event loop if that still runs, else a fresh one).
  The hook is registered with `threading._register_atexit`, the one `concurrent.futures` itself uses,
  because deleting a sandbox runs work in threads (`asyncio.to_thread`) and plain `atexit` hooks run
  only after the thread pools refuse new work.
SIGKILL cannot be caught: the orchestrator's lifeline watcher (lifeline.py), a process of its own that sees
the owner's end of a pipe close, deletes its sandboxes then."""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 — its shutdown hook must be registered before ours (see end)
import signal
import threading
import weakref
from typing import Protocol


class ClosesAtExit(Protocol):
    def close_at_exit(self) -> None: ...


_open_clients: "weakref.WeakSet[ClosesAtExit]" = weakref.WeakSet()
_lock = threading.Lock()


def _sigterm_to_system_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def register(client: ClosesAtExit) -> None:
    with _lock:
        _open_clients.add(client)
        on_main_thread = threading.current_thread() is threading.main_thread()
        if on_main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _sigterm_to_system_exit)


def unregister(client: ClosesAtExit) -> None:
    with _lock:
        _open_clients.discard(client)
        if _open_clients or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is _sigterm_to_system_exit:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _close_open_clients() -> None:
    for client in list(_open_clients):
        client.close_at_exit()


# Hooks registered this way run in reverse order, so ours runs before the thread pools shut down.
getattr(threading, "_register_atexit", atexit.register)(_close_open_clients)
