"""Images a harness recorded in a trajectory (an MCP tool's result, react's observations), written as files
beside the run's trajectories — OUT/images/<rollout key>/... , the paths the observations' image parts name
(ATIF: relative to the trajectory file) — rather than carried in the JSONL as base64."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from orchard.core.trajectory import IMAGES_DIR, PENDING_IMAGES, Trajectory


def keep_images(trajectory: Trajectory, out_dir: Path | None) -> None:
    """Write the trajectory's pending images under `out_dir` and drop them from it (kept in the trajectory
    when there is no `out_dir`). A path that does not stay under OUT/images/ is dropped, not written."""
    pending = trajectory.extra.get(PENDING_IMAGES)
    if not isinstance(pending, dict) or out_dir is None:
        return
    root = (out_dir / IMAGES_DIR).resolve()
    for path, data in pending.items():
        target = (out_dir / path).resolve()
        if not target.is_relative_to(root):
            continue
        try:
            content = base64.b64decode(data, validate=True)
        except (binascii.Error, TypeError):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    del trajectory.extra[PENDING_IMAGES]
