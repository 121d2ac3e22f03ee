"""Pydantic models of the orchestrator: what it persists and what its REST API returns besides
`SandboxInfo` (which lives in orchard/core)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.sandbox import SandboxInfo
from orchard.core.backend import BackendSandbox

# States after which a sandbox never runs again; such rows are kept a while so that clients learn why.
TERMINAL_STATES = frozenset({"deleted", "lost"})


class SandboxRecord(BaseModel):
    """One row of the store: the public info, the backend's private handle (None until the backend made
    the sandbox) and the id of the service instance that is responsible for it."""

    model_config = ConfigDict(allow_inf_nan=False)
    info: SandboxInfo
    backend: BackendSandbox | None = None
    service_id: str
    finished_at: float | None = Field(default=None, description="when it became deleted or lost")


class Reowned(BaseModel):
    """`SandboxStore.reown_within_cap`'s answer. `reowned`: the member is the new owner's now (counted
    against its cap, its idempotency key bound to it); `gone`: no longer a ready member of the old owner;
    `key_taken`: the key names `sandbox_id` already; `over_cap`: the new owner has `live` sandboxes, its cap."""

    outcome: Literal["reowned", "gone", "key_taken", "over_cap"]
    sandbox_id: str | None = None
    live: int = 0


class ServiceRecord(BaseModel):
    """A running orchestrator instance sharing the store. Several may (an `orchard serve` and scripts using
    the embedded SDK on the same home); each only manages its own sandboxes and takes over those of dead
    instances."""

    model_config = ConfigDict(allow_inf_nan=False)
    id: str
    host: str
    pid: int
    pid_start: str | None = Field(default=None, description="process start time, guards against pid reuse")
    last_seen: float
    ephemeral: bool = Field(default=False, description="its sandboxes die with it (the embedded SDK): when "
                                                       "it died, they are deleted rather than adopted")
    stopped: bool = Field(default=False, description="stopped, leaving sandboxes for another instance")


class QuarantinedRow(BaseModel):
    """A stored row that could not be read back (corrupt, or refused by this version's validation). It is
    moved out of the live tables so that it never stops listing, reaping or a restart; its sandbox is
    deleted (`cleaned_up` once that succeeded) since nothing could enforce its TTL any more."""

    seq: int
    kind: str = Field(description="'sandbox' or 'service'")
    id: str
    record: str = Field(description="the row's JSON as it was stored")
    reason: str
    quarantined_at: float
    cleaned_up: bool = False


class ReconcileReport(BaseModel):
    """What `reconcile` did with the sandboxes it found after a (re)start."""

    adopted: list[str] = Field(default_factory=list, description="still running: kept and served again")
    orphans_removed: list[str] = Field(
        default_factory=list,
        description="running but unknown to the store, or whose creation was interrupted: deleted")
    lost: list[str] = Field(default_factory=list, description="known but no longer running: marked lost")
    expired: list[str] = Field(default_factory=list, description="TTL passed while nobody watched: deleted")


class Health(BaseModel):
    status: str = "ok"
    backend: str
    sandboxes: int = Field(description="sandboxes that are creating, ready or being deleted")


class AdmissionRules(BaseModel):
    """What `SandboxStore.admit` checks before it inserts a new sandbox's record (see admission.py)."""

    live_states: tuple[str, ...]
    max_sandboxes: int | None = None
    max_per_owner: int | None = None
    rate_per_s: float | None = None
    rate_burst: float = 1.0
    idempotency_key: str | None = None
    fingerprint: str | None = Field(default=None, description="the spec's hash, with an idempotency key")
    yield_to_waiting: bool = Field(default=False, description="refused while any create waits for a place under "
                                                              "the server cap (a pool member's start)")


class Admitted(BaseModel):
    """`SandboxStore.admit`'s answer. `admitted`: the record is in; `existing`: the idempotency key's sandbox
    (`sandbox_id`) answers instead; `conflict`: the key was used with another spec; `full`: `cap` (server,
    owner or rate) refused it (server also: a pool member's start while creates wait), `live` sandboxes counting
    against it, `retry_after_s` for the rate."""

    outcome: Literal["admitted", "existing", "conflict", "full"]
    sandbox_id: str | None = None
    cap: Literal["server", "owner", "rate"] | None = None
    live: int = 0
    pool_members: int = Field(default=0, description="with cap server: how many of `live` are unclaimed pool "
                                                     "members (idle, starting or being evicted)")
    retry_after_s: float | None = None
