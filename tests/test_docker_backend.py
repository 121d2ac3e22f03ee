"""The docker backend against a real daemon (scripts/docker/daemon.sh in CI) and real containers of the
Debian image that `daemon.sh image` builds. Each test has its own `instance` label, so one test's
`list_live` never sees another's sandboxes. Tests of what is refused before the daemon is asked (and of
an unreachable daemon) run without one."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchard.core.backend import BackendSandbox
from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from tests.docker_daemon import TEST_IMAGE, require_daemon

if os.environ.get("ORCHARD_DOCKER") == "1":
    import docker as docker_sdk  # required: a missing SDK fails instead of skipping
else:
    docker_sdk = pytest.importorskip("docker", reason="the docker SDK is not installed (pip install -e '.[docker]')")

from orchard.sandbox.backends.docker import DockerBackend  # noqa: E402
from orchard.sandbox.backends.docker.config import DockerConfig  # noqa: E402


@pytest.fixture(scope="session")
def base_url() -> str:
    return require_daemon()


@pytest.fixture
def make_backend(base_url, short_tmp):
    """Backends on the real daemon, one instance label per test; what a test leaves is removed."""
    instance = f"t{secrets.token_hex(4)}"
    made: list[DockerBackend] = []

    def make(**overrides) -> DockerBackend:
        options = {"base_url": base_url, "instance": instance, "default_image": TEST_IMAGE,
                   "pull": "never", "run_dir": short_tmp / "run", "bundle_cache_dir": _bundle_cache(),
                   **overrides}
        backend = DockerBackend(DockerConfig(**options))
        made.append(backend)
        return backend

    yield make
    cleaner = make()

    async def clean() -> None:
        for found in await cleaner.list_live():
            await cleaner.delete(found)
        for backend in made:
            await backend.close()

    asyncio.run(clean())


def _bundle_cache() -> Path:
    return Path(os.environ.get("ORCHARD_HOME") or Path.home() / ".orchard") / "cache"


def _engine(base_url: str):
    return docker_sdk.APIClient(base_url=base_url, version="auto")


def _spec(**fields) -> SandboxSpec:
    return SandboxSpec(image=TEST_IMAGE, **fields)


async def _exec(sandbox: BackendSandbox, token: str, command: str, **options):
    agent = AgentSandbox(sandbox.id, sandbox.agent_url, token)
    try:
        return await agent.exec(command, **options)
    finally:
        await agent.close()


def _host_address() -> str:
    """An IPv4 address of this machine other than loopback (what a container would try to reach)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    addresses = [line.split()[3].split("/")[0] for line in out.splitlines()]
    assert addresses, "this machine has no global IPv4 address to test egress against"
    return addresses[0]


class Listener:
    """A TCP server on all of this machine's addresses that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


CONNECT = ("python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3); "
           "print(\"connected\")' {host} {port}")
GATEWAY = ("python3 -c 'import socket,struct; rows=[l.split() for l in open(\"/proc/net/route\")][1:]; "
           "print(next(socket.inet_ntoa(struct.pack(\"<L\", int(r[2], 16))) for r in rows if r[1] == \"00000000\"))'")


FORK_BOMB = """python3 -c '
import subprocess
children = []
try:
    for _ in range(200):
        children.append(subprocess.Popen(["sleep", "30"]))
except OSError as e:
    print("refused after", len(children), e.strerror)
for child in children:
    child.kill()
'"""


# --- with a daemon ---------------------------------------------------------------------------------------

@pytest.mark.docker
async def test_create_exec_files_delete_leaves_nothing(make_backend, base_url):
    backend = make_backend()
    token = secrets.token_hex(16)
    started = time.perf_counter()
    sandbox = await backend.create("basic", _spec(cpu=1, memory_mb=256), token, owner="alice")
    ready_s = time.perf_counter() - started
    timings = sandbox.timings  # image and container started, then the agent's first health answer
    assert timings.backend_create_ms > 0 and timings.first_health_ms >= 0
    assert timings.backend_create_ms + timings.first_health_ms <= timings.total_ms
    agent = AgentSandbox(sandbox.id, sandbox.agent_url, token)
    try:
        result = await agent.exec("echo hi")
        assert (result.exit_code, result.stdout) == (0, "hi\n")
        await agent.write_file("/workspace/notes.txt", b"written through the agent\n")
        assert await agent.read_file("/workspace/notes.txt") == b"written through the agent\n"
        tools = await agent.exec("git --version && python3 -c 'import pytest; print(pytest.__version__)'")
        assert tools.exit_code == 0, tools.stderr
        latencies = []
        for _ in range(20):
            t0 = time.perf_counter()
            await agent.exec("true")
            latencies.append(time.perf_counter() - t0)
    finally:
        await agent.close()
    print(f"docker create->ready {ready_s:.3f} s, exec p50 {statistics.median(latencies) * 1000:.1f} ms")
    assert await backend.is_alive(sandbox)

    api = _engine(base_url)
    try:
        info = api.inspect_container(sandbox.handle["container_id"])
        assert info["Config"]["Labels"]["orchard.dev/owner"] == "alice"
        # The token is a read-only file mount: neither in the environment nor in the labels.
        assert not any(token in value for value in [*info["Config"]["Env"], *info["Config"]["Labels"].values()])
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert mounts["/.orchard"]["RW"] is False and mounts["/.orchard-token"]["RW"] is False
        assert info["HostConfig"]["NetworkMode"] == "none"

        await backend.delete(sandbox)
        await backend.delete(sandbox)  # idempotent
        assert api.containers(all=True, filters={"label": f"orchard.dev/instance={backend.instance}"}) == []
    finally:
        api.close()
    assert not Path(sandbox.handle["run_dir"]).exists()
    assert not await backend.is_alive(sandbox)


@pytest.mark.docker
async def test_network_none_has_no_egress_yet_the_agent_is_reached(make_backend):
    backend = make_backend()
    listener = Listener()
    try:
        none = await backend.create("net-none", _spec(network={"mode": "none"}), "t1")
        interfaces = await _exec(none, "t1", "ls /sys/class/net")
        assert interfaces.stdout.split() == ["lo"]
        refused = await _exec(none, "t1", CONNECT.format(host=_host_address(), port=listener.port))
        assert refused.exit_code != 0 and "unreachable" in refused.stderr.lower()

        # The same probe does connect from an `open` sandbox: the refusal above is the network mode's.
        open_ = await backend.create("net-open", _spec(network={"mode": "open"}), "t2")
        gateway = (await _exec(open_, "t2", GATEWAY)).stdout.strip()
        reached = await _exec(open_, "t2", CONNECT.format(host=gateway, port=listener.port))
        assert reached.stdout == "connected\n", reached.stderr
        assert listener.accepted >= 1
    finally:
        listener.close()


@pytest.mark.docker
async def test_memory_and_process_limits_are_enforced(make_backend, base_url):
    backend = make_backend()
    sandbox = await backend.create("limits", _spec(memory_mb=128, max_processes=64, cpu=0.5), "t")
    hog = await _exec(sandbox, "t", "python3 -c 'b = bytearray(400 * 2**20); print(len(b))'", timeout=60)
    assert hog.exit_code != 0 and "419430400" not in hog.stdout
    bomb = await _exec(sandbox, "t", FORK_BOMB, timeout=60)
    assert bomb.stdout.startswith("refused after "), bomb
    assert int(bomb.stdout.split()[2]) < 64
    # The agent outlived both: the sandbox still answers.
    assert (await _exec(sandbox, "t", "echo alive")).stdout == "alive\n"
    api = _engine(base_url)
    try:
        host = api.inspect_container(sandbox.handle["container_id"])["HostConfig"]
    finally:
        api.close()
    assert (host["Memory"], host["MemorySwap"], host["PidsLimit"], host["NanoCpus"]) == \
        (128 << 20, 128 << 20, 64, 500_000_000)


@pytest.mark.docker
async def test_a_second_backend_readopts_from_labels(make_backend, base_url):
    first = make_backend()
    sandbox = await first.create("adopt", _spec(), "tok")
    second = make_backend()  # a restarted orchestrator: same instance, no state of its own
    (found,) = await second.list_live()
    assert (found.id, found.agent_url, found.handle["container_id"]) == \
        (sandbox.id, sandbox.agent_url, sandbox.handle["container_id"])
    assert (await _exec(found, "tok", "echo again")).stdout == "again\n"
    other = make_backend(instance=f"other{secrets.token_hex(3)}")
    assert await other.list_live() == []

    # A sandbox whose agent died is not live, and list_live removes its container and directory.
    api = _engine(base_url)
    try:
        api.kill(found.handle["container_id"])
        assert not await second.is_alive(found)
        assert await second.list_live() == []
        assert api.containers(all=True, filters={"label": f"orchard.dev/sandbox={sandbox.id}"}) == []
    finally:
        api.close()
    assert not Path(found.handle["run_dir"]).exists()


@pytest.mark.docker
async def test_a_missing_image_is_the_callers_error_and_leaves_nothing(make_backend, base_url, short_tmp):
    backend = make_backend(pull="missing")
    image = f"localhost/orchard-no-such-image:{secrets.token_hex(3)}"
    with pytest.raises(InvalidRequest) as err:
        await backend.create("noimage", SandboxSpec(image=image), "t")
    assert image in str(err.value) and "daemon.sh image" in str(err.value)
    with pytest.raises(InvalidRequest, match="pulling is off"):
        await make_backend(pull="never").create("noimage", SandboxSpec(image=image), "t")
    api = _engine(base_url)
    try:
        assert api.containers(all=True, filters={"label": f"orchard.dev/instance={backend.instance}"}) == []
    finally:
        api.close()
    assert list((short_tmp / "run").rglob("token")) == []


@pytest.mark.docker
async def test_a_dying_agent_fails_the_create_with_its_output(make_backend, base_url):
    """A workdir the agent cannot create makes it exit: create says so, with the agent's own words, at once
    instead of at the ready timeout."""
    backend = make_backend(ready_timeout_s=300)
    with pytest.raises(BackendError, match="exited") as err:
        await backend.create("dies", _spec(workdir="/proc/orchard-cannot"), "t")
    # the container's exit ended the wait, not the ready timeout (which would say "did not answer")
    assert "workdir" in str(err.value) and "did not answer" not in str(err.value)
    api = _engine(base_url)
    try:
        assert api.containers(all=True, filters={"label": f"orchard.dev/instance={backend.instance}"}) == []
    finally:
        api.close()


@pytest.mark.docker
async def test_the_same_id_twice_is_refused_without_touching_the_first(make_backend, short_tmp):
    backend = make_backend()
    first = await backend.create("twice", _spec(), "t")
    with pytest.raises(InvalidRequest, match="already exists"):
        await backend.create("twice", _spec(), "t")
    # Another orchestrator of the instance whose run_dir differs: its host directory is new, the daemon
    # refuses the container name, and the first sandbox's container is left alone.
    elsewhere = make_backend(run_dir=short_tmp / "e")
    with pytest.raises(InvalidRequest, match="already exists"):
        await elsewhere.create("twice", _spec(), "t")
    assert await backend.is_alive(first)
    assert (await _exec(first, "t", "echo still")).stdout == "still\n"


@pytest.mark.docker
async def test_image_host_runs_the_default_image(make_backend, base_url):
    backend = make_backend()
    sandbox = await backend.create("host", SandboxSpec(image="host"), "t")
    api = _engine(base_url)
    try:
        assert api.inspect_container(sandbox.handle["container_id"])["Config"]["Image"] == TEST_IMAGE
    finally:
        api.close()


# --- without a daemon ------------------------------------------------------------------------------------

async def test_an_unreachable_daemon_names_its_socket_and_the_script(tmp_path):
    socket_path = tmp_path / "no-daemon.sock"
    backend = DockerBackend(DockerConfig(base_url=f"unix://{socket_path}", run_dir=tmp_path / "run"))
    with pytest.raises(BackendError) as err:
        await backend.create("x", SandboxSpec(image="debian:bookworm"), "t")
    assert str(socket_path) in str(err.value) and "scripts/docker/daemon.sh up" in str(err.value)
    await backend.close()


@pytest.mark.parametrize("fields, lacking", [
    ({"network": {"mode": "allowlist", "allow": ["example.com:443"]}}, "network mode 'allowlist'"),
    ({"disk_mb": 100}, "disk_mb"),
    ({"image": "/srv/rootfs"}, "images of kind 'rootfs'"),
])
async def test_what_it_cannot_enforce_is_refused_before_the_daemon_is_asked(tmp_path, fields, lacking):
    backend = DockerBackend(DockerConfig(base_url=f"unix://{tmp_path}/none.sock", run_dir=tmp_path / "run"))
    with pytest.raises(InvalidRequest, match="docker backend cannot honour") as err:
        await backend.create("x", SandboxSpec(**{"image": "debian:bookworm", **fields}), "t")
    assert lacking in str(err.value)
    await backend.close()


def test_disk_mb_is_a_capability_only_with_the_disk_quota():
    assert "disk_mb" not in DockerBackend(DockerConfig()).capabilities.limits
    assert "disk_mb" in DockerBackend(DockerConfig(disk_quota=True)).capabilities.limits


def test_config_defaults_from_the_environment(tmp_path):
    home = tmp_path / "home"
    config = DockerConfig.from_env(home, {"DOCKER_HOST": "unix:///run/podman/podman.sock",
                                          "ORCHARD_DOCKER_INSTANCE": "ci", "ORCHARD_DOCKER_PULL": "never",
                                          "ORCHARD_DOCKER_DISK_QUOTA": "1"})
    assert (config.base_url, config.instance, config.pull, config.disk_quota, config.bundle_cache_dir) == \
        ("unix:///run/podman/podman.sock", "ci", "never", True, home / "cache")
    # Without DOCKER_HOST: the socket of scripts/docker/daemon.sh when it is there, else the system's.
    workdir = tmp_path / "docker"
    workdir.mkdir()
    assert DockerConfig.from_env(home, {"ORCHARD_DOCKER_DIR": str(workdir)}).base_url == \
        "unix:///var/run/docker.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(workdir / "docker.sock"))
        assert DockerConfig.from_env(home, {"ORCHARD_DOCKER_DIR": str(workdir)}).base_url == \
            f"unix://{workdir}/docker.sock"
