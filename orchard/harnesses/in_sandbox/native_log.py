"""Reading an agent's native log back out of the sandbox: JSON and JSONL files that may be absent (the agent
died first) or cut short (it was killed mid-write)."""

from __future__ import annotations

import json
from typing import Any

from orchard.core.errors import NotFound
from orchard.core.sandbox import Sandbox


def parse_jsonl(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; a line cut short (the writer was killed) and what follows it are
    dropped."""
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break
        if isinstance(record, dict):
            records.append(record)
    return records


async def read_jsonl(sandbox: Sandbox, path: str) -> list[dict[str, Any]]:
    """`parse_jsonl` of the file at `path`; [] when there is none."""
    try:
        return parse_jsonl(await sandbox.read_file(path))
    except NotFound:
        return []


async def read_json(sandbox: Sandbox, path: str) -> dict[str, Any] | None:
    """The JSON object in the file at `path`; None when it is absent or holds no object."""
    try:
        data = json.loads(await sandbox.read_file(path))
    except (NotFound, ValueError):  # absent (the agent died first): nothing to say
        return None
    return data if isinstance(data, dict) else None
