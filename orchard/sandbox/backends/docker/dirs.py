"""The host side of one docker sandbox: a private directory holding its token file and the agent's socket.

    <run_dir>/<instance key>/<sandbox key>/
        token        the sandbox token (mounted read-only at TOKEN_MOUNT; never in env or labels)
        sock/        mounted at /.orchard/run: the agent binds sock/agent.sock in there
        agent.sock   a hard link to that socket, made by the orchestrator as soon as the agent bound it

The container can replace anything in `sock/` (its root may write there), but not the hard link beside
it: the orchestrator only ever connects through `agent.sock`, which stays the socket the agent bound (a
symlink put in sock/ can never redirect the orchestrator to some other socket of this host). Keys are
hashes, so socket paths stay far below the kernel's 108 bytes whatever the ids."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from orchard.core.errors import BackendError

SOCKET_NAME = "agent.sock"
MAX_SOCKET_PATH = 107


def instance_key(instance: str) -> str:
    return hashlib.sha256(f"instance\0{instance}".encode()).hexdigest()[:8]


def sandbox_key(instance: str, sandbox_id: str) -> str:
    return hashlib.sha256(f"{instance}\0{sandbox_id}".encode()).hexdigest()[:20]


class SandboxDir:
    """The host directory of one sandbox."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.token = path / "token"
        self.sock_dir = path / "sock"
        self.inner_socket = self.sock_dir / SOCKET_NAME
        self.socket = path / SOCKET_NAME

    @property
    def agent_url(self) -> str:
        return f"unix://{self.socket}"

    def make(self, token: str) -> None:
        """Create it (FileExistsError when it is there). The token file is world-readable inside a 0700
        directory: the image's user, whoever it is, reads it through its mount; nobody on the host can."""
        if len(str(self.socket).encode()) > MAX_SOCKET_PATH:
            raise BackendError(f"the agent socket path {self.socket} is longer than {MAX_SOCKET_PATH} bytes; "
                               "set a shorter run_dir (ORCHARD_DOCKER_RUN_DIR) or TMPDIR")
        self.path.mkdir(mode=0o700)
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        os.chmod(self.token, 0o444)  # whatever the umask
        self.sock_dir.mkdir()
        os.chmod(self.sock_dir, 0o777)  # the agent may run as any user of the image

    def link_socket(self) -> bool:
        """Make `agent.sock` once the agent has bound its socket; True when it exists."""
        if os.path.lexists(self.socket):
            return True
        try:
            st = os.lstat(self.inner_socket)
        except FileNotFoundError:
            return False
        if not stat.S_ISSOCK(st.st_mode):
            raise BackendError(f"{self.inner_socket} is not the agent's socket (mode {st.st_mode:o})")
        os.link(self.inner_socket, self.socket, follow_symlinks=False)
        return True

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def ensure_private_dir(path: Path) -> None:
    """`path` (and its parents) exist; the directory itself is ours with mode 0700, or BackendError: it is
    shared by every orchestrator of this uid in a world-writable /tmp."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BackendError(f"{path} must be a directory owned by uid {os.getuid()} with mode 0700; remove it "
                           "or set another run_dir (ORCHARD_DOCKER_RUN_DIR)")
