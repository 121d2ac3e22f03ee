"""`orchard eval --pool N`: warm pools for a run's task sandboxes. Each distinct template among the tasks
(their sandbox spec without env and labels, orchard/core/pool.py) gets a pool that keeps N sandboxes
started, so a trial's environment phase claims one instead of starting it cold; graders' sandboxes of the
same template claim from it too."""

from __future__ import annotations

from typing import Iterable

from orchard.core.pool import PoolSpec, template_key
from orchard.core.task import Task
from orchard.eval.in_sandbox import sandbox_overrides

MAX_EVAL_POOLS = 16  # distinct templates kept warm at most; tasks past them start cold


def eval_pools(tasks: Iterable[Task], size: int, bundle: str | None) -> list[PoolSpec]:
    """One pool of `size` per distinct task template (the first MAX_EVAL_POOLS, in task order)."""
    if size < 1:
        return []
    pools: dict[str, PoolSpec] = {}
    for task in tasks:
        overrides = sandbox_overrides(task, bundle) if bundle else {}
        spec = task.environment.sandbox_spec(**{**overrides, "env": {}, "labels": {}})
        key = template_key(spec)
        if key not in pools and len(pools) < MAX_EVAL_POOLS:
            pools[key] = PoolSpec(name=f"eval-{len(pools) + 1}", spec=spec, min_ready=size, max_size=size)
    return list(pools.values())
