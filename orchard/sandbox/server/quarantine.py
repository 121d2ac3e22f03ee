"""Deleting the sandboxes of quarantined rows.

A row the store cannot read back (store.py moves it to its `quarantine` table) describes a sandbox that
nothing manages any more: no TTL, no heartbeat, no owner can reach it through the API. So its sandbox is
deleted: through the backend handle salvaged from the row's JSON when there is one, else by id (backends
find what is left of a sandbox from its id alone). Runs at every reaper pass; a failure is retried."""

from __future__ import annotations

import json
import logging
from typing import Any

from orchard.core.backend import BackendSandbox
from orchard.sandbox.server.models import QuarantinedRow
from orchard.sandbox.server.service_face import ServiceFace

log = logging.getLogger("orchard.sandbox.server")


async def clean_up_quarantined(service: ServiceFace) -> list[str]:
    """Delete the sandbox of every quarantined sandbox row not cleaned up yet; returns their ids."""
    cleaned = []
    for row in service.store.quarantined(kind="sandbox", pending_only=True):
        if row.id in service.creating or row.id in service.deleting:
            continue  # this instance is at work on it right now; the next pass takes it
        try:
            await service.backend.delete(salvaged_backend_sandbox(row))
        except Exception as e:
            log.warning("could not delete the sandbox of quarantined row %s (will retry): %s", row.id, e)
            continue
        service.store.mark_cleaned_up(row.seq)
        log.info("deleted the sandbox of quarantined row %s", row.id)
        cleaned.append(row.id)
    return cleaned


def salvaged_backend_sandbox(row: QuarantinedRow) -> BackendSandbox:
    """The backend's handle from the row's JSON if it is still readable, else a bare one (id only)."""
    try:
        data: Any = json.loads(row.record)
        backend = data.get("backend") if isinstance(data, dict) else None
        if isinstance(backend, dict) and backend.get("id") == row.id:
            return BackendSandbox.model_validate(backend)
    except ValueError:
        pass
    return BackendSandbox(id=row.id, agent_url="")
