"""Every model call the gateway made, grouped by rollout key: in memory (thread-safe), and optionally
appended to a JSON Lines file as it happens (one `LLMCall` per line) so nothing is lost if the process
dies. The file is flushed per line but not fsync'd: an fsync per model call would add milliseconds."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import IO

from orchard.core.errors import InvalidRequest
from orchard.core.trajectory import LLMCall


class Recorder:
    def __init__(self, sink: str | Path | None = None) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, list[LLMCall]] = defaultdict(list)
        self._sink: IO[str] | None = None
        if sink is not None:
            path = Path(sink)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._sink = open(path, "a", encoding="utf-8")
            except OSError as exc:
                raise InvalidRequest(f"cannot open the gateway's record file {path} for appending: {exc}") from None

    def add(self, call: LLMCall) -> None:
        key = call.rollout_key or ""
        line = call.model_dump_json() + "\n" if self._sink is not None else None
        with self._lock:
            self._calls[key].append(call)
            if self._sink is not None and line is not None:
                self._sink.write(line)
                self._sink.flush()

    def calls(self, rollout_key: str) -> list[LLMCall]:
        """The calls recorded for `rollout_key` so far, oldest first (a copy)."""
        with self._lock:
            return list(self._calls.get(rollout_key, ()))

    def pop(self, rollout_key: str) -> list[LLMCall]:
        """The calls recorded for `rollout_key`, which the recorder then forgets."""
        with self._lock:
            return self._calls.pop(rollout_key, [])

    def rollout_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._calls)

    def close(self) -> None:
        with self._lock:
            if self._sink is not None:
                self._sink.close()
                self._sink = None
