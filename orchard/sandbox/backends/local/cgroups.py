"""Resource limits for local sandboxes through cgroups (v1, v2 or a hybrid of both).

Each sandbox gets one group per controller, `orchard/<name>` beneath the cgroup this process runs in
(so any limit placed on the orchestrator still covers its sandboxes). A v1 controller mounted on its own
is preferred; otherwise the controller is used from the cgroup2 hierarchy when it is enabled there. The
sandbox is moved into its groups before it runs anything (see `procs_files`); `kill_and_remove` empties
and removes them. When nothing is writable (not root, read-only cgroupfs, a v2 cgroup with processes of
its own) `create_cgroups` returns None and the caller decides (limits.py) whether the spec's limits
can be enforced otherwise. A limit the kernel refuses or does not keep as written (EINVAL for `cpu: 1e9`)
is `InvalidRequest`, never a silent fallback.

With `split` (the local backend as root, whose agent can use it) the memory and pids groups get two
leaves: `agent`, where the sandbox starts, and `workload`, where the agent starts every command (the
agent's workload_cgroup.py). `workload` has the spec's `memory_mb` and `max_processes`, so a workload that
fills them meets its own limit and the OOM killer chooses among its processes only; `agent` has
`AGENT_PIDS` processes of its own and, on cgroup v2, `AGENT_MEMORY_MIN_MB` that reclaim never takes; the
sandbox's group bounds both at `memory_mb + AGENT_MEMORY_MB`. The cpu quota stays on the sandbox's group,
shared. Limits of the spec thus bind the workload exactly as asked; the agent's own use, which counted
against them before, no longer does.

Making, limiting, finding and removing a sandbox's groups all follow the same placement rules (`placements`,
the leaves), so they stay in this one file, a little over ~400 lines."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
SPLIT_CONTROLLERS = ("memory", "pids")
AGENT_LEAF, WORKLOAD_LEAF = "agent", "workload"
AGENT_MEMORY_MB = 64  # the agent's room above memory_mb (its buffers, files it writes to a tmpfs)
AGENT_MEMORY_MIN_MB = 16  # cgroup v2: memory of the agent's that reclaim never takes
AGENT_PIDS = 512  # the agent's threads (a connection each) and its init
CPU_PERIOD_US = 100_000
PARENT_NAME = "orchard"


class CgroupSet(BaseModel):
    """The groups of one sandbox: their directories and which hierarchy each lives in."""

    paths: list[str]  # every group made, leaves before their parent (the order to remove them in)
    version: dict[str, int]  # path -> 1 or 2
    controllers: list[str] = []  # those the groups have (and whose limits were set)
    enter: list[str] = []  # where the sandbox starts (the `agent` leaves with `split`); [] = paths
    workload: list[str] = []  # the `workload` leaves, [] without `split`
    # (group, version, its controllers, those split into leaves): what `set_limits` writes the spec into
    placed: list[tuple[str, int, list[str], list[str]]] = []

    @property
    def procs_files(self) -> list[str]:
        return [f"{p}/cgroup.procs" for p in (self.enter or self.paths)]

    @property
    def workload_procs_files(self) -> list[str]:
        return [f"{p}/cgroup.procs" for p in self.workload]


def _mounts() -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """v1 controller -> (mount point, mount root), and the cgroup2 (mount point, mount root) if any."""
    v1: dict[str, tuple[str, str]] = {}
    v2 = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) < 3:
                continue
            fstype, root, point = rfields[0], fields[3], fields[4]
            if fstype == "cgroup2" and v2 is None:
                v2 = (point, root)
            elif fstype == "cgroup":
                for opt in rfields[2].split(","):
                    if opt in CONTROLLERS and opt not in v1:
                        v1[opt] = (point, root)
    return v1, v2


def _own_cgroups() -> tuple[dict[str, str], str | None]:
    """This process's cgroup path per v1 controller, and its v2 path."""
    v1: dict[str, str] = {}
    v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "":
                v2 = path
            for c in controllers.split(","):
                v1[c] = path
    return v1, v2


def _under_mount(point: str, root: str, path: str) -> Path:
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return Path(point) / rel.lstrip("/")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _v2_enable(parent: Path, controllers: list[str]) -> list[str]:
    """Enable `controllers` for children of `parent`; returns the ones now enabled."""
    available = (parent / "cgroup.controllers").read_text().split()
    wanted = [c for c in controllers if c in available]
    if wanted:
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
    return wanted


def placements(name: str) -> list[tuple[Path, int, list[str]]]:
    """(group dir, version, controllers) for each hierarchy the sandbox will join."""
    v1_mounts, v2_mount = _mounts()
    own_v1, own_v2 = _own_cgroups()
    placements: list[tuple[Path, int, list[str]]] = []
    v2_controllers = []
    for c in CONTROLLERS:
        if c in v1_mounts:
            point, root = v1_mounts[c]
            base = _under_mount(point, root, own_v1.get(c, "/"))
            placements.append((base / PARENT_NAME / name, 1, [c]))
        else:
            v2_controllers.append(c)
    if v2_controllers and v2_mount is not None and own_v2 is not None:
        base = _under_mount(*v2_mount, own_v2)
        enabled = [c for c in v2_controllers if c in (base / "cgroup.controllers").read_text().split()]
        if enabled:
            placements.append((base / PARENT_NAME / name, 2, enabled))
    return placements


def create_cgroups(name: str, spec: SandboxSpec, split: bool = False) -> CgroupSet | None:
    """Make the sandbox's groups and set its limits, or return None when cgroups cannot be used here
    (nothing is left behind then). `split`: the agent and workload leaves (see the module's docstring)."""
    made: list[str] = []
    versions: dict[str, int] = {}
    have: list[str] = []
    enter: list[str] = []
    workload: list[str] = []
    placed: list[tuple[str, int, list[str], list[str]]] = []
    try:
        for group, version, controllers in placements(name):
            controllers = _make_group(group, version, controllers)
            made.append(str(group))
            versions[str(group)] = version
            split_here = [c for c in controllers if c in SPLIT_CONTROLLERS] if split else []
            placed.append((str(group), version, controllers, split_here))
            have += controllers
            if not split_here:
                enter.append(str(group))
                continue
            if version == 2:
                _v2_enable(group, split_here)
            leaves = _make_leaves(group, version, split_here)
            made[-1:] = [str(leaf) for leaf in leaves] + [str(group)]
            versions.update({str(leaf): version for leaf in leaves})
            workload.append(str(leaves[0]))
            enter.append(str(leaves[1]))
        if not made:
            return None
        made_set = CgroupSet(paths=made, version=versions, controllers=have, enter=enter if split else [],
                             workload=workload, placed=placed)
        set_limits(made_set, spec)
    except LimitNotApplied as e:
        remove_cgroups(made)
        raise InvalidRequest(str(e)) from None
    except InvalidRequest:
        remove_cgroups(made)
        raise
    except OSError as e:
        log.warning("cgroups are not usable here (%s); only limits that hold without them are accepted", e)
        remove_cgroups(made)
        return None
    return made_set


def set_limits(groups: CgroupSet, spec: SandboxSpec) -> None:
    """Write the spec's limits into groups made with none (by `create_cgroups`, or a spare's made ahead of
    its sandbox, spares.py): the spec's own on the workload's leaves with a split, the memory of both
    leaves on the sandbox's group. InvalidRequest when the kernel refuses one or keeps another value;
    OSError when the groups cannot be written at all."""
    try:
        for group, version, controllers, split_here in groups.placed:
            for c in controllers:
                if c not in split_here:
                    _set_limit(Path(group), version, c, spec)
            if "memory" in split_here and spec.memory_mb:
                both = spec.model_copy(update={"memory_mb": spec.memory_mb + AGENT_MEMORY_MB})
                _set_limit(Path(group), version, "memory", both)
            for c in split_here:
                _set_limit(Path(group) / WORKLOAD_LEAF, version, c, spec)
    except LimitNotApplied as e:
        raise InvalidRequest(str(e)) from None


def rename_cgroups(groups: CgroupSet, name: str) -> CgroupSet:
    """The same groups under `name` (cgroup v1 only: cgroup2 has no rename), with everything in them: how a
    spare's groups become its sandbox's. A failure renames back those already renamed and raises OSError."""
    if any(version != 1 for version in groups.version.values()):
        raise OSError(errno.EOPNOTSUPP, "cgroup2 groups cannot be renamed")
    moves = [(group, str(Path(group).with_name(name))) for group, _, _, _ in groups.placed]
    done = []
    try:
        for old, new in moves:
            os.rename(old, new)
            done.append((old, new))
    except OSError:
        for old, new in reversed(done):
            with contextlib.suppress(OSError):
                os.rename(new, old)
        raise

    def renamed(path: str) -> str:
        for old, new in moves:
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path

    return CgroupSet(paths=[renamed(p) for p in groups.paths],
                     version={renamed(p): v for p, v in groups.version.items()},
                     controllers=groups.controllers, enter=[renamed(p) for p in groups.enter],
                     workload=[renamed(p) for p in groups.workload],
                     placed=[(renamed(g), v, c, s) for g, v, c, s in groups.placed])


def _make_leaves(group: Path, version: int, controllers: list[str]) -> list[Path]:
    """[workload, agent] leaves of `group`, made; the agent's own limits set (the workload's are the
    spec's: `set_limits`)."""
    leaves = [group / WORKLOAD_LEAF, group / AGENT_LEAF]
    for leaf in leaves:
        leaf.mkdir()
    agent = leaves[1]
    if "pids" in controllers:
        _apply(agent / "pids.max", str(AGENT_PIDS), "the agent's own pids.max")
    if "memory" in controllers and version == 2 and (agent / "memory.min").exists():
        _apply(agent / "memory.min", str(AGENT_MEMORY_MIN_MB << 20), "the agent's memory.min")
    return leaves


def _with_leaves(group: Path) -> list[Path]:
    """The group's leaves that exist, then the group: the order to empty and remove them in."""
    return [group / leaf for leaf in (WORKLOAD_LEAF, AGENT_LEAF) if (group / leaf).is_dir()] + [group]


class LimitNotApplied(Exception):
    """The kernel refused a limit value, or keeps another one than was written."""


def _make_group(group: Path, version: int, controllers: list[str]) -> list[str]:
    """mkdir the group (and the shared parent); returns the controllers it has."""
    for attempt in range(3):
        try:
            if version == 2:
                _v2_enable(group.parent.parent, controllers)
                group.parent.mkdir(exist_ok=True)
                controllers = _v2_enable(group.parent, controllers)
            else:
                group.parent.mkdir(exist_ok=True)
            group.mkdir()
            return controllers
        except FileNotFoundError:
            # A concurrent delete removed the then-empty shared parent between our two mkdirs.
            if attempt == 2:
                raise
    return controllers


def _set_limit(group: Path, version: int, controller: str, spec: SandboxSpec) -> None:
    if controller == "memory" and spec.memory_mb:
        limit = str(spec.memory_mb * 1024 * 1024)
        if version == 1:
            _apply(group / "memory.limit_in_bytes", limit, f"memory_mb={spec.memory_mb}")
            if (group / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
                _apply(group / "memory.memsw.limit_in_bytes", limit, f"memory_mb={spec.memory_mb}")
        else:
            _apply(group / "memory.max", limit, f"memory_mb={spec.memory_mb}")
            if (group / "memory.swap.max").exists():
                _apply(group / "memory.swap.max", "0", f"memory_mb={spec.memory_mb} (no swap)")
    elif controller == "pids" and spec.max_processes:
        _apply(group / "pids.max", str(spec.max_processes), f"max_processes={spec.max_processes}")
    elif controller == "cpu" and spec.cpu:
        quota = str(int(spec.cpu * CPU_PERIOD_US))
        if version == 1:
            _write(group / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _apply(group / "cpu.cfs_quota_us", quota, f"cpu={spec.cpu:g}")
        else:
            _apply(group / "cpu.max", f"{quota} {CPU_PERIOD_US}", f"cpu={spec.cpu:g}")


def _apply(path: Path, value: str, asked: str) -> None:
    """Write a limit and read it back: the kernel refusing it (EINVAL, ERANGE) or keeping another value
    (clamping) means the spec cannot be enforced as asked."""
    try:
        _write(path, value)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ERANGE, errno.EOVERFLOW):
            raise  # cgroups not usable at all (EACCES, EROFS, ...): the caller decides
        raise LimitNotApplied(f"{asked} cannot be enforced on this machine: the kernel refused it "
                              f"({os.strerror(e.errno)} setting {path.name}); ask for a smaller value") from None
    kept = path.read_text().strip()
    if kept != value:
        raise LimitNotApplied(f"{asked} cannot be enforced on this machine: the kernel keeps {path.name} = "
                              f"{kept!r} instead of {value!r}; ask for a smaller value")


def cgroup_pids(paths: list[str]) -> set[int]:
    pids: set[int] = set()
    for p in paths:
        try:
            pids.update(int(x) for x in Path(p, "cgroup.procs").read_text().split())
        except OSError:
            pass
    return pids


def kill_and_remove(paths: list[str], timeout: float = 5.0) -> list[str]:
    """SIGKILL everything still in the groups, then remove them (and their `orchard` parent when it is
    empty). Returns the groups that could not be removed."""
    deadline = time.monotonic() + timeout
    while True:
        pids = cgroup_pids(paths)
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)
    return remove_cgroups(paths)


def existing_groups(name: str) -> list[str]:
    """The groups named `name` that exist: found by name when a crash left them unrecorded."""
    try:
        return [str(g) for group, _, _ in placements(name) if group.is_dir() for g in _with_leaves(group)]
    except OSError:
        return []


def remove_abandoned_groups(in_use: Callable[[], set[str]], prefix: str) -> list[str]:
    """rmdir empty sandbox groups whose name starts with `prefix` (the caller's own: other orchestrators'
    groups share the parent) and is not `in_use()` (their sandbox's state was deleted under them, so no
    delete will ever come). The kernel refuses to remove a group that has processes. `in_use` is asked after
    the groups are listed, so a group made meanwhile by a create (whose name is in use before its group
    exists) is never taken for abandoned."""
    if not prefix:
        raise ValueError("remove_abandoned_groups needs the caller's own prefix: without one it would take "
                         "the empty groups of other orchestrators' creates in progress")
    removed = []
    try:
        parents = {group.parent for group, _, _ in placements("probe")}
    except OSError:
        return removed
    candidates = []
    for parent in parents:
        try:
            names = os.listdir(parent)
        except FileNotFoundError:
            continue  # no sandbox here (or the last one's delete just removed the parent)
        candidates += [group for group in map(parent.joinpath, names)
                       if group.name.startswith(prefix) and group.is_dir()
                       and not cgroup_pids([str(g) for g in _with_leaves(group)])]
    names = in_use()
    for group in candidates:
        if group.name not in names:
            for g in _with_leaves(group):
                try:
                    g.rmdir()
                    removed.append(str(g))
                except OSError:
                    break
    for parent in parents:
        try:
            parent.rmdir()
        except OSError:
            pass
    return removed


def remove_cgroups(paths: list[str], timeout: float = 2.0) -> list[str]:
    left = []
    for p in paths:
        group = Path(p)
        deadline = time.monotonic() + timeout
        while True:
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                # EBUSY lingers briefly while the kernel finishes tearing down killed tasks.
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    left.append(p)
                    break
                time.sleep(0.005)
        try:
            group.parent.rmdir()  # the shared `orchard` parent, only once no sandbox uses it
        except OSError:
            pass
    return left
