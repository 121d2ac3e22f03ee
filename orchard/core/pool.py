"""Warm pools: pre-started sandboxes of one *template*, handed out ("claimed") with a fresh token and the
caller's env and labels instead of being started cold. Pydantic only, no I/O; the orchestrator's side is
orchard/sandbox/server/pools.py and the user's guide docs/pools.md.

A template is a `SandboxSpec` minus what a claim applies or the orchestrator enforces per sandbox: `env`
and `labels` (set at claim), `timeout_s` and `heartbeat_timeout_s` (the claimed sandbox's own TTL).
Everything else (image, limits, workdir, network, bundles) is fixed when a member starts, so it is the
template; `template_key` is a hash of exactly those fields, and a member is only handed out to a spec of
the same key."""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.core.sandbox import SandboxSpec

# Fields of a spec a claim sets on a pre-started sandbox, or the orchestrator tracks per sandbox.
PER_CLAIM_FIELDS = frozenset({"env", "labels", "timeout_s", "heartbeat_timeout_s"})
POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


def template_fields(spec: SandboxSpec) -> dict:
    """The spec's template as JSON data: every field but PER_CLAIM_FIELDS."""
    return spec.model_dump(mode="json", exclude=set(PER_CLAIM_FIELDS))


def template_key(spec: SandboxSpec) -> str:
    """A short stable hash of the spec's template (`tpl-` + 16 hex digits)."""
    canonical = json.dumps(template_fields(spec), sort_keys=True, separators=(",", ":"))
    return "tpl-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def template_differences(spec: SandboxSpec, template: SandboxSpec) -> list[str]:
    """The template fields where `spec` differs from `template`, as `field=value (pool: value)`."""
    mine, theirs = template_fields(spec), template_fields(template)
    return [f"{name}={json.dumps(mine[name])} (pool: {json.dumps(theirs[name])})"
            for name in sorted(mine) if mine[name] != theirs[name]]


class PoolSpec(BaseModel):
    """One pool: its template and its size. `min_ready` members are kept started (refilled after each
    claim); at most `max_size` exist at once, started or starting (claimed ones no longer count: they are
    ordinary sandboxes then). `on_demand`: a claim that found the pool empty raises the number kept ready
    by one (up to `max_size`), so the pool grows to the demand it sees; members idle longer than
    `max_idle_s` are replaced, or removed down to `min_ready`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str = Field(description="the pool's name (lowercase letters, digits, '.', '_', '-')")
    spec: SandboxSpec = Field(default_factory=SandboxSpec,
                              description="the template: a spec without env and labels (a claim sets those)")
    min_ready: int = Field(default=1, ge=0, le=10_000, description="members kept started")
    max_size: int | None = Field(default=None, ge=1, le=10_000,
                                 description="most members at once, started or starting (default: min_ready, "
                                             "at least 1)")
    refill_per_s: float | None = Field(default=None, gt=0,
                                       description="most member starts a second (None: as fast as "
                                                   "refill_parallel allows)")
    refill_parallel: int = Field(default=4, ge=1, le=256, description="member starts in flight at once")
    on_demand: bool = Field(default=False, description="an empty pool at a claim keeps one more ready next time")
    member_timeout_s: float = Field(default=4 * 3600.0, gt=0,
                                    description="TTL of an unclaimed member (bounded by the orchestrator's "
                                                "maximum TTL)")
    max_idle_s: float = Field(default=1800.0, gt=0, description="an unclaimed member older than this is replaced")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(POOL_NAME_PATTERN, v):
            raise ValueError(f"pool name {v[:80]!r} is not valid: lowercase letters, digits, '.', '_' and '-', "
                             "starting with a letter or digit, at most 63 characters")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "PoolSpec":
        if self.spec.env or self.spec.labels:
            raise ValueError("a pool's spec is a template: leave env and labels empty; each create (claim) sets "
                             "its own")
        if self.max_size is not None and self.max_size < self.min_ready:
            raise ValueError(f"max_size={self.max_size} is below min_ready={self.min_ready}; raise max_size or "
                             "lower min_ready")
        if self.max_idle_s >= self.member_timeout_s:
            raise ValueError(f"max_idle_s={self.max_idle_s:g} must be below member_timeout_s="
                             f"{self.member_timeout_s:g}: a member is replaced before its TTL ends")
        return self

    @property
    def size_cap(self) -> int:
        return self.max_size if self.max_size is not None else max(self.min_ready, 1)

    @property
    def template(self) -> str:
        return template_key(self.spec)


class PoolsConfig(BaseModel):
    """The pools of one orchestrator: `orchard serve --pools FILE` (YAML or JSON), `Orchard(pool=...)`."""

    model_config = ConfigDict(extra="forbid")
    pools: list[PoolSpec] = Field(default_factory=list, max_length=256)

    @model_validator(mode="after")
    def _unique(self) -> "PoolsConfig":
        names = [p.name for p in self.pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pool names must be unique; named twice: {', '.join(twice)}")
        keys = [p.template for p in self.pools]
        same = sorted({p.name for p in self.pools if keys.count(p.template) > 1})
        if same:
            raise ValueError(f"pools {', '.join(same)} have the same template: a create could not tell which "
                             "to claim from; merge them into one pool")
        return self


class PoolStatus(BaseModel):
    """`GET /v1/pools`: one pool as its orchestrator runs it now."""

    name: str
    template: str
    min_ready: int
    max_size: int
    target: int = Field(description="members it keeps ready now (min_ready, more when on_demand grew it)")
    idle: int = Field(description="started members waiting for a claim")
    starting: int = Field(description="members being started")
    claims: int = Field(description="creates served from the pool")
    misses: int = Field(description="creates that matched the pool but were made cold (pool empty)")
    started: int = Field(description="members started since the orchestrator started")
    failed: int = Field(description="member starts that failed")
    drained: int = Field(description="members removed unclaimed (template changed, idle too long, stopped)")
    evicted: int = Field(default=0, description="idle members deleted to make room for creates of other templates "
                                                "waiting at the server's max_sandboxes")
    last_error: str | None = None


class PoolStatusList(BaseModel):
    pools: list[PoolStatus]
