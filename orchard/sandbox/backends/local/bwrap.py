"""bubblewrap for local sandboxes: the arguments that make one sandbox (where the binary is:
orchard/sandbox/bubblewrap.py).

What the arguments do:
- every namespace is new (`--unshare-all`): pid (the host's processes are invisible, and killing the
  namespace's init kills everything in it), mount, ipc, uts, cgroup, user, and net unless the network is
  `open` — a new net namespace has only a loopback device, so `none` means no egress at all;
- all capabilities are dropped: bwrap run by root would otherwise keep them inside the user namespace,
  and CAP_SYS_ADMIN there can remount a read-only bind of a host directory read-write;
- run by root, the user namespace maps the sandbox's uids and gids 0-65534 to the host's subordinate
  range 100000-165534 (`id_map`): the sandbox's root is host uid 100000, which reads host files only as
  any unprivileged user would. The map is written by the backend while bwrap waits (`--userns-block-fd`).
  Host root is mapped too, as uid 65535, only because bwrap sets the sandbox up as host root (it must
  reach Orchard's private directories); the agent starts as that uid with CAP_SETUID/SETGID/SETPCAP/
  KILL/SYS_ADMIN alone, makes the workload's own pid namespace (the agent's pidns.py; its init becomes
  uid 65534) and, before serving, becomes uid 0 of the sandbox (host 100000) and drops every capability,
  bounding set included (`--user 0:0`), so nothing in the sandbox can become 65535 again;
- image `host`: the root is an empty read-only tmpfs holding read-only binds of the host's top-level
  directories, so nothing can be created on the host (a plain `--ro-bind / /` makes bwrap mkdir mount
  points on the host's real root); image = rootfs directory: an overlay whose upper layer is private to
  the sandbox, so the shared rootfs is never written;
- fresh /dev (read-only but for its devices and a size-limited /dev/shm) and /proc; /tmp and /run (image
  `host`) are directories of the writable layer, so they count against `disk_mb` like the workspace;
  Orchard's own state directories (the home with every sandbox's workspace and the state db) covered by
  empty tmpfs mounts, so one sandbox never sees another's files;
- with `spec.bundles`, a tiny read-only tmpfs at /.orchard/harness holding a read-only bind of each
  built harness bundle at /.orchard/harness/<name> (docs/harness-bundles.md);
- the agent bundle read-only at /.orchard, and at /.orchard/run a tiny read-only tmpfs holding only the
  token and the workload's environment (WORKLOAD_ENV_FILE; the agent's own is `agent_env`, the same for
  every sandbox) and, with `network.gateway`, the model gateway's Unix socket, bound in read-only (the
  agent relays 127.0.0.1:4000 to it, and the sandbox has no other way out). The agent's socket is not in the
  sandbox at all: it is bound on the host and handed to the agent
  as an open file descriptor (`--listen fd:N`), so nothing the sandbox can write lies outside its
  writable layer, and the sandbox cannot swap the socket its clients connect to.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import HARNESS_MOUNT_ROOT, SandboxSpec
import orchard.sandbox.backends.local.netns as netns
from orchard.sandbox.bundle import DEFAULT_MOUNT_POINT
from orchard.sandbox.images import IdMap, ImageStore

RUN_MOUNT_POINT = f"{DEFAULT_MOUNT_POINT}/run"
SOCKET_NAME = "agent.sock"
TOKEN_NAME = "token"
# The workload's environment (bwrap.workload_env), a file beside the token, read by the agent once.
WORKLOAD_ENV_FILE = f"{RUN_MOUNT_POINT}/env"
SERVICES_MOUNT = f"{RUN_MOUNT_POINT}/services"  # the task services' state (agent/services.py STATE_ROOT)
GATEWAY_SOCKET = f"{RUN_MOUNT_POINT}/gateway.sock"  # where the model gateway's socket is bound inside
# /dev/shm is a tmpfs, i.e. memory: this size, or a quarter of memory_mb when that is less (a full
# /dev/shm cannot be reclaimed by killing processes, so it must leave room for the rest of the sandbox).
DEFAULT_SHM_MB = 64
RUN_TMPFS_BYTES = 64 << 10  # /.orchard/run: mount points of the token, the workload's env, the gateway
HARNESS_TMPFS_BYTES = 64 << 10  # /.orchard/harness: the bundles' mount points and nothing else
# Root's sandboxes: sandbox ids 0..REMAP_COUNT-1 are host ids REMAP_BASE.., and host root is REMAP_COUNT.
REMAP_BASE = 100000
REMAP_COUNT = 65535
SANDBOX_USER = "0:0"  # what the commands run as inside: root of the sandbox, host 100000
# The agent's own with `agent_apart`: one its commands cannot signal, trace or read (host 165533).
AGENT_USER = "65533:65533"
# The task's services with `agent_apart` (agent/services.py): apart from the commands and the agent, so that
# neither the workload nor a service can signal or read the other (host 165532).
SERVICE_USER = "65532:65532"
# The init of the commands' pid namespace (see the agent's pidns.py): a uid of its own, so that its /proc
# files are not the workload's (host 165534).
INIT_USER = "65534:65534"
# CAP_SYS_ADMIN: for the agent's unshare(CLONE_NEWPID) and its init's /proc mount; dropped, with the
# rest, bounding set included, before either runs anything of the workload's.
AGENT_SETUP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL", "CAP_SYS_ADMIN")


def remaps_ids() -> bool:
    """Whether sandboxes get the subordinate id range: writing a map of other ids needs root."""
    return os.geteuid() == 0


def image_ids() -> IdMap | None:
    """How imported images are owned on the host: shifted into the sandboxes' range when they are root's,
    so that the image's root is the sandbox's root; else the importing user's."""
    return IdMap(base=REMAP_BASE, count=REMAP_COUNT) if remaps_ids() else None


def id_map() -> str:
    """/proc/PID/uid_map and gid_map of a sandbox made by root."""
    return f"0 {REMAP_BASE} {REMAP_COUNT}\n{REMAP_COUNT} 0 1\n"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RESERVED_PATHS = ("/proc", "/dev", DEFAULT_MOUNT_POINT)
KERNEL_TREES = ("/proc", "/sys", "/dev")  # never a rootfs image
# Host top-level entries a sandbox gets fresh instead of bound (/run holds the host's service sockets,
# which a read-only bind would still let a sandbox connect to).
HOST_ENTRIES_REPLACED = {"proc", "dev", "tmp", "run"}
# Orchard's own package (orchard/): with an editable install, a checkout outside the venv.
ORCHARD_PACKAGE_DIR = Path(__file__).resolve().parents[3]


class SandboxPaths(BaseModel):
    """Host paths of one sandbox. `writable_dir` holds the workspace, /tmp and /run (image `host`) or the
    overlay's upper/work dirs (rootfs images); with `disk_mb` it is a size-limited tmpfs mounted there in
    the sandbox's private mount namespace only."""

    sandbox_dir: Path
    run_dir: Path  # short (socket paths are limited to 108 bytes), host-only

    @property
    def writable_dir(self) -> Path:
        return self.sandbox_dir / "rw"

    @property
    def services_dir(self) -> Path:
        """The task services' state (spec.services), bound at SERVICES_MOUNT: owned by their user, 0700, and
        a mount point on a read-only tmpfs inside, so the workload can neither enter, rename nor remove it."""
        return self.sandbox_dir / "services"

    @property
    def socket(self) -> Path:
        """What clients connect to: the agent's listening socket, bound here by the backend and handed to
        the agent as a file descriptor. The sandbox never sees this directory."""
        return self.run_dir / SOCKET_NAME

    @property
    def meta_file(self) -> Path:
        return self.sandbox_dir / "meta.json"

    @property
    def log_file(self) -> Path:
        return self.sandbox_dir / "agent.log"

    @property
    def args_file(self) -> Path:
        return self.sandbox_dir / "bwrap.args"


def validate_image(spec: SandboxSpec, images: ImageStore | None = None) -> Path | None:
    """None for the host image, else the rootfs directory: the image's path, or for an OCI reference
    (`oci:NAME`, or a plain NAME) the rootfs `orchard image import` unpacked into `images`. Raises
    InvalidRequest before anything exists."""
    workdir = Path(spec.workdir)
    reserved = [p for p in RESERVED_PATHS if workdir == Path(p) or Path(p) in workdir.parents]
    if ".." in workdir.parts:
        raise InvalidRequest(f"workdir {spec.workdir} must not contain '..'")
    if reserved or (spec.image == "host" and workdir == Path("/")):
        raise InvalidRequest(f"workdir {spec.workdir} is not usable: / (for image 'host'), /proc, /dev and "
                             f"{DEFAULT_MOUNT_POINT} are set up by the sandbox itself; use e.g. /workspace")
    if spec.image == "host":
        top = Path("/", *workdir.parts[1:2])
        if (workdir != top and top.name not in HOST_ENTRIES_REPLACED and top.exists()
                and not workdir.is_dir()):
            raise InvalidRequest(
                f"workdir {spec.workdir} does not exist on the host and cannot be created under the "
                f"read-only host root ({top} exists there); pick a workdir whose top-level directory is "
                "not on the host, e.g. /workspace")
        return None
    if not spec.image.startswith("/") and images is not None:
        return _imported_rootfs(spec.image, images)
    rootfs = Path(spec.image)
    if not rootfs.is_absolute():
        raise InvalidRequest(f"image {spec.image!r} is not usable by the local backend: give 'host' or the "
                             "absolute path of a rootfs directory")
    _refuse_kernel_tree(spec.image, Path(os.path.normpath("/" + spec.image.lstrip("/"))))  # before touching it
    try:
        resolved = rootfs.resolve()
    except OSError as e:  # /proc/1/root and the like: a magic link we may not follow
        raise InvalidRequest(f"image {spec.image!r} cannot be used as a rootfs ({e.strerror}); give a directory "
                             "holding an unpacked image") from None
    if resolved == Path("/"):
        raise InvalidRequest(f"image {spec.image!r} is the host's root, which cannot be a rootfs (the "
                             "sandbox's own files live under it); use image 'host' for the host's root")
    _refuse_kernel_tree(spec.image, resolved)
    if not rootfs.is_dir():
        raise InvalidRequest(f"rootfs {spec.image} does not exist or is not a directory; build or unpack "
                             "the image there first (e.g. debootstrap, or `podman export` + tar -x)")
    return rootfs


def _refuse_kernel_tree(image: str, path: Path) -> None:
    """/proc, /sys and /dev are the kernel's views, not file trees: an overlay cannot be made of them (the
    sandbox failed to start, a 503), and they hold nothing an image needs."""
    for tree in KERNEL_TREES:
        if path == Path(tree) or Path(tree) in path.parents:
            raise InvalidRequest(f"image {image!r} is under {tree}, which the kernel provides and which cannot "
                                 "be a rootfs; give a directory holding an unpacked image, or 'host'")


def _imported_rootfs(image: str, images: ImageStore) -> Path:
    record = images.resolve(image)
    if record.ids != image_ids():  # its files' owners would be wrong inside: root's shifted ids, or not
        who = "root" if record.ids is not None else "an unprivileged user"
        raise InvalidRequest(f"image {image!r} was imported by {who}, who owns its files differently from "
                             f"sandboxes made as uid {os.geteuid()}; run `orchard image import FILE` again as "
                             "the user that runs the sandboxes")
    return images.rootfs(record)


def with_image_env(spec: SandboxSpec, images: ImageStore) -> SandboxSpec:
    """An imported image's ENV (its PATH, say) under the spec's own env, as container engines apply it.
    It is the workload's environment only (`workload_env`): the agent's own process never gets it, so
    an image's LD_PRELOAD, PYTHONPATH or any other loader or interpreter variable reaches its commands
    (where the image means it) and never the agent (`agent_env`)."""
    if spec.image == "host" or spec.image.startswith("/"):
        return spec
    image_env = dict(entry.split("=", 1) for entry in images.resolve(spec.image).config.env if "=" in entry)
    return spec.model_copy(update={"env": {**image_env, **spec.env}}) if image_env else spec


def workload_env(spec: SandboxSpec, rootfs: Path | None) -> dict[str, str]:
    """The environment the agent's commands and shells start from (`with_image_env` applied first). It
    reaches the agent as data, a file at WORKLOAD_ENV_FILE, never as its own environment."""
    for key, value in spec.env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidRequest(f"env {key!r} is not valid: names must be non-empty without '=' or NUL, "
                                 "values without NUL")
    env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "HOME": "/root" if rootfs else spec.workdir}
    env.update(spec.env)
    return env


def agent_env(host_network: bool = False) -> dict[str, str]:
    """The agent's own environment, the same for every sandbox: nothing of the spec's or the image's, so
    no variable can change what the bundled loader and interpreter load (the interpreter also starts
    isolated, bundle.INTERPRETER_FLAGS). Where its token and its commands' environment are. LC_ALL=C:
    the C library's built-in locale, so that the agent reads no locale or gconv file of the image's (its
    interpreter's UTF-8 mode, -X utf8, does without them). `host_network`: the sandbox shares the host's
    network namespace, so the agent opens none of its ports (its loopback is the host's: agent/ports.py)."""
    env = {"PATH": SANDBOX_PATH, "LC_ALL": "C", "ORCHARD_AGENT_TOKEN_FILE": f"{RUN_MOUNT_POINT}/{TOKEN_NAME}",
           "ORCHARD_AGENT_ENV_FILE": WORKLOAD_ENV_FILE}
    if host_network:
        env["ORCHARD_AGENT_HOST_NETWORK"] = "1"
    return env


def shares_host_network(spec: SandboxSpec) -> bool:
    """Network 'open' without a gateway shares the host's network namespace (`--share-net`)."""
    return spec.network.mode == "open" and not spec.network.gateway


def encode_workload_env(env: dict[str, str]) -> bytes:
    """WORKLOAD_ENV_FILE's content, as the agent reads it (its __main__.py `_read_workload_env`)."""
    return json.dumps(env).encode()


def validate_disk(spec: SandboxSpec) -> None:
    if spec.disk_mb and os.geteuid() != 0:
        raise InvalidRequest("disk_mb on the local backend needs root (it mounts a size-limited tmpfs); "
                             "run the orchestrator as root or leave disk_mb unset")


def validate_network(spec: SandboxSpec) -> None:
    netns.check_network(spec.network)  # allowlist (and open with the gateway): entries, and whether it can


def shm_mb(spec: SandboxSpec) -> int:
    return max(1, min(DEFAULT_SHM_MB, spec.memory_mb // 4)) if spec.memory_mb else DEFAULT_SHM_MB


def _host_root_args(hidden: Sequence[Path]) -> list[str]:
    args = ["--tmpfs", "/"]
    for entry in sorted(os.scandir("/"), key=lambda e: e.name):
        if entry.name in HOST_ENTRIES_REPLACED:
            continue
        dest = f"/{entry.name}"
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), dest]
        elif entry.is_dir() or entry.is_file():
            args += ["--ro-bind", entry.path, dest]
    # Orchard's own state (other sandboxes' workspaces, tokens in the state db, a dev cluster's sockets)
    # must not show through the host root: cover each such directory with an empty tmpfs.
    for path in hidden:
        if any(other in path.parents for other in hidden):
            continue  # under another covered directory: hidden with it
        top = path.parts[1] if len(path.parts) > 1 else ""
        if top and top not in HOST_ENTRIES_REPLACED and path.is_dir():
            # read-only: `--remount-ro /` does not reach submounts, and a writable tmpfs is host memory
            args += ["--size", "4096", "--tmpfs", str(path), "--remount-ro", str(path)]
    return args


def _closed_ancestor(path: Path) -> Path | None:
    """The topmost directory on the way to `path` that users other than its owner cannot enter."""
    for depth in range(2, len(path.parts) + 1):
        ancestor = Path(*path.parts[:depth])
        try:
            if not os.stat(ancestor).st_mode & 0o001:
                return ancestor
        except OSError:
            return None
    return None


def _orchard_env_dirs() -> list[Path]:
    """Orchard's venv, the interpreter that made it, and Orchard's own package where an editable install
    keeps it outside the venv (a checkout): what runs in a sandbox from the host (the Claw world's
    services, orchard/worlds) is read from there."""
    dirs = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    package = ORCHARD_PACKAGE_DIR.resolve()
    if not any(package.is_relative_to(env_dir) for env_dir in dirs):
        dirs.add(package)
    return sorted(dirs)


def _orchard_env_args(remapped: bool) -> list[str]:
    """Orchard's own Python environment (_orchard_env_dirs) stays usable at its path: tasks on the host
    image run tools with it. Bound where the sandbox gets a fresh directory (a checkout under /tmp); and
    where the sandbox's unprivileged user could not enter a directory on the way (a pyenv Python under
    /root, 0700), that directory is replaced by a read-only tmpfs holding only the environment, so nothing
    else of it shows."""
    args: list[str] = []
    covers: list[Path] = []
    for env_dir in _orchard_env_dirs():
        if len(env_dir.parts) <= 2 or not env_dir.is_dir():
            continue
        if env_dir.parts[1] in HOST_ENTRIES_REPLACED:
            # On the sandbox's own /tmp or /run: the directories on the way are made by bwrap as host
            # root, 0700 unless asked otherwise, which the remapped sandbox root could not enter.
            for depth in range(3, len(env_dir.parts)):
                args += ["--perms", "0755", "--dir", str(Path(*env_dir.parts[:depth]))]
            args += ["--ro-bind", str(env_dir), str(env_dir)]
            continue
        closed = _closed_ancestor(env_dir) if remapped else None
        if closed is None:
            continue
        if closed not in covers:
            covers.append(closed)
            args += ["--perms", "0755", "--tmpfs", str(closed)]
        for depth in range(len(closed.parts) + 1, len(env_dir.parts)):  # enterable on the way down
            args += ["--perms", "0755", "--dir", str(Path(*env_dir.parts[:depth]))]
        args += ["--ro-bind", str(env_dir), str(env_dir)]
    for closed in covers:
        args += ["--remount-ro", str(closed)]
    return args


def _workdir_parents_args(workdir: str) -> list[str]:
    """The workdir's parents on the sandbox's own root (e.g. /workspace for /workspace/deep), made 0755:
    bwrap would make them 0700 for the user it sets up as (host root, unmapped inside), which the
    sandbox's root could then not even look through."""
    parents = [parent for parent in reversed(Path(workdir).parents) if parent != Path("/")]
    if not parents or (parents[0].name not in HOST_ENTRIES_REPLACED and parents[0].exists()):
        return []  # under a host directory: it exists there, read-only (validate_image checks)
    if parents[0].name in HOST_ENTRIES_REPLACED:
        parents = parents[1:]  # /tmp and /run are the sandbox's own (its writable layer)
    args: list[str] = []
    for parent in parents:
        args += ["--perms", "0755", "--dir", str(parent)]
    return args


def bwrap_args(spec: SandboxSpec, rootfs: Path | None, paths: SandboxPaths, bundle_dir: Path,
               hostname: str, env: dict[str, str], info_fd: int, token_fd: int,
               hidden: Sequence[Path] = (), userns_block_fd: int | None = None,
               gateway_socket: Path | None = None,
               harness_bundles: Sequence[tuple[str, Path]] = (), hold_fd: int | None = None,
               env_fd: int | None = None) -> list[str]:
    """bwrap's options, passed through `--args FD` so that none of them (the environment!) shows on a
    command line; the command itself must follow on the real command line. `env` is the agent's own
    (`agent_env`). `token_fd` is read by bwrap into /.orchard/run/token, `env_fd` (the workload's
    environment, `encode_workload_env`) into WORKLOAD_ENV_FILE; both 0400, the agent reads them before it
    takes the sandbox's identity. With `userns_block_fd`, bwrap waits on it for the backend to write `id_map`
    into the new user namespace, and the agent keeps the capabilities it needs to switch to the sandbox
    user (and then drops them). `gateway_socket`: the model gateway's, bound at GATEWAY_SOCKET.
    `harness_bundles`: (name, host directory) pairs, mounted read-only at HARNESS_MOUNT_ROOT/<name>.
    `hold_fd`: bwrap's init blocks reading it once every mount is made, and runs no command while it
    does: the agent zygote forks the agent into the namespaces instead (zygote.py)."""
    args = ["--unshare-all"]
    if shares_host_network(spec):  # with a gateway: routed (netns.routed)
        args.append("--share-net")
    args += ["--cap-drop", "ALL"]
    if userns_block_fd is not None:
        args += ["--unshare-user", "--userns-block-fd", str(userns_block_fd)]
        for cap in AGENT_SETUP_CAPS:
            args += ["--cap-add", cap]
    args += ["--new-session", "--hostname", hostname, "--info-fd", str(info_fd)]
    if hold_fd is not None:
        args += ["--block-fd", str(hold_fd)]
    rw = paths.writable_dir
    if rootfs is None:
        args += _host_root_args(hidden)
    else:
        args += ["--overlay-src", str(rootfs), "--overlay", str(rw / "upper"), str(rw / "work"), "/"]
    # /dev/shm is memory: always size-limited, even when no memory cgroup would account for it.
    args += ["--dev", "/dev", "--size", str(shm_mb(spec) << 20), "--perms", "01777", "--tmpfs", "/dev/shm",
             "--proc", "/proc"]
    if rootfs is None:
        # /tmp and /run on the writable layer: within disk_mb, never in the host's memory.
        args += ["--bind", str(rw / "tmp"), "/tmp", "--bind", str(rw / "run"), "/run"]
        args += _orchard_env_args(remapped=userns_block_fd is not None)
        args += _workdir_parents_args(spec.workdir)
        args += ["--bind", str(rw / "workspace"), spec.workdir]
    else:
        # The workdir is made by the agent once it is the sandbox's user, so that it owns it.
        args += ["--perms", "01777", "--dir", "/tmp"]
        if spec.network.mode == "open" and Path("/etc/resolv.conf").exists():
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    args += ["--ro-bind", str(bundle_dir), DEFAULT_MOUNT_POINT,
             "--size", str(RUN_TMPFS_BYTES), "--perms", "0755", "--tmpfs", RUN_MOUNT_POINT,
             "--perms", "0400", "--ro-bind-data", str(token_fd), f"{RUN_MOUNT_POINT}/{TOKEN_NAME}"]
    if env_fd is not None:
        args += ["--perms", "0400", "--ro-bind-data", str(env_fd), WORKLOAD_ENV_FILE]
    if gateway_socket is not None:
        args += ["--ro-bind", str(gateway_socket), GATEWAY_SOCKET]
    if spec.services:
        args += ["--bind", str(paths.services_dir), SERVICES_MOUNT]
    args += ["--remount-ro", RUN_MOUNT_POINT, "--remount-ro", "/dev"]
    if harness_bundles:  # a tiny read-only tmpfs holding only the bundles' mount points
        args += ["--size", str(HARNESS_TMPFS_BYTES), "--perms", "0755", "--tmpfs", HARNESS_MOUNT_ROOT]
        for name, path in harness_bundles:
            args += ["--ro-bind", str(path), f"{HARNESS_MOUNT_ROOT}/{name}"]
        args += ["--remount-ro", HARNESS_MOUNT_ROOT]
    if rootfs is None:
        args += ["--remount-ro", "/"]
    args += ["--chdir", spec.workdir if rootfs is None else "/", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args
