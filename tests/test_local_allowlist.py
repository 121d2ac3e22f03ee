"""Network `allowlist` on the local backend (local/netns.py), on real sandboxes: what an allowlist lets a
sandbox reach and what it does not (other ports, the internet, the host's own addresses and loopback,
other sandboxes), host names and IPv6 refused, and nothing left behind — after a delete, a create that
failed half way, and sandboxes that died while no orchestrator watched.

Destinations: TCP servers on a test-only address added to the host's `lo` (198.51.100.7, a documentation
range; removed afterwards), on the host's own address, and on a "remote" machine: a network namespace of
its own behind a veth pair of the test's, which the host routes to (so the path through the host's
forwarding and masquerading is the one taken to any other machine)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator

import pytest

from orchard.core.backend import BackendSandbox
from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import NetworkPolicy, SandboxSpec
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local import backend as local_module
from orchard.sandbox.backends.local import netns as local_netns
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.backends.local.config import local_capabilities
from orchard.sandbox.backends.local.state import LocalHandle, process_running
from tests.local_backend_rig import running

pytestmark = pytest.mark.skipif(local_netns.unavailable_reason() is not None,
                                reason=local_netns.unavailable_reason() or "")

TEST_ADDRESS = "198.51.100.7"  # TEST-NET-2: on no real network
PROBE = ("import socket, sys\n"
         "try:\n"
         "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
         "    print('CONNECTED')\n"
         "except OSError as e:\n"
         "    print('REFUSED', e.errno)\n")


# `backend` is conftest.py's fixture.


@pytest.fixture(scope="module")
def test_address() -> Iterator[str]:
    """TEST_ADDRESS on the host's loopback device for the module's tests, removed afterwards."""
    added = subprocess.run(["ip", "addr", "add", f"{TEST_ADDRESS}/32", "dev", "lo"], capture_output=True)
    try:
        yield TEST_ADDRESS
    finally:
        if added.returncode == 0:
            subprocess.run(["ip", "addr", "del", f"{TEST_ADDRESS}/32", "dev", "lo"], check=True)


REMOTE_HOST_END, REMOTE_ADDRESS = "198.18.0.1", "198.18.0.2"  # the benchmarking range (RFC 2544)
REMOTE_IFACE = "orchtest-remote"
# The remote machine's servers: answer each connection with the address it came from.
REMOTE_SERVER = ("import selectors, socket\n"
                 "sel = selectors.DefaultSelector()\n"
                 "ports = []\n"
                 "for _ in range(2):\n"
                 "    s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(16)\n"
                 "    sel.register(s, selectors.EVENT_READ); ports.append(s.getsockname()[1])\n"
                 "print(*ports, flush=True)\n"
                 "while True:\n"
                 "    for key, _ in sel.select():\n"
                 "        c, peer = key.fileobj.accept(); c.sendall(peer[0].encode() + b'\\n'); c.close()\n")
SOURCE_PROBE = ("import socket, sys\n"
                "try:\n"
                "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
                "    print('FROM', c.makefile().readline().strip())\n"
                "except OSError as e:\n"
                "    print('REFUSED', e.errno)\n")


@pytest.fixture(scope="module")
def remote() -> Iterator[tuple[int, int]]:
    """Two TCP servers on REMOTE_ADDRESS, a network namespace of their own reached from the host over the
    veth pair REMOTE_IFACE; yields their ports."""
    server = subprocess.Popen(["unshare", "--net", sys.executable, "-c", REMOTE_SERVER], stdout=subprocess.PIPE,
                              text=True)
    try:
        ports = tuple(int(p) for p in server.stdout.readline().split())
        subprocess.run(["ip", "link", "add", REMOTE_IFACE, "type", "veth", "peer", "name", "eth0", "netns",
                        str(server.pid)], check=True)
        subprocess.run(["ip", "addr", "add", f"{REMOTE_HOST_END}/30", "dev", REMOTE_IFACE], check=True)
        subprocess.run(["ip", "link", "set", REMOTE_IFACE, "up"], check=True)
        subprocess.run(["nsenter", f"--net=/proc/{server.pid}/ns/net", "sh", "-c",
                        f"ip addr add {REMOTE_ADDRESS}/30 dev eth0 && ip link set eth0 up && "
                        f"ip route add default via {REMOTE_HOST_END}"], check=True)
        yield ports
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "link", "del", REMOTE_IFACE], capture_output=True)  # else gone with the netns


@contextlib.contextmanager
def tcp_server(address: str) -> Iterator[int]:
    """Accepts and closes connections on `address`; yields the port."""
    server = socket.socket()
    server.bind((address, 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def host_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.123", 9))  # no packet is sent: the route's source address
        return probe.getsockname()[0]


@contextlib.asynccontextmanager
async def allowlisted(backend: LocalBackend, allow: list[str]):
    async with running(backend, SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=allow))) as (sb, agent):
        yield sb, agent
    assert leftovers(backend, sb) == [], "the sandbox's network survived its delete"


async def reaches(agent: AgentSandbox, host: str, port: int) -> bool:
    r = await agent.exec(["python3", "-c", PROBE, host, str(port)], timeout=30)
    assert "CONNECTED" in r.stdout or "REFUSED" in r.stdout, (r.stdout, r.stderr)
    return "CONNECTED" in r.stdout


def leftovers(backend: LocalBackend, sb: BackendSandbox) -> list[str]:
    """What of this sandbox's network is still on the host: its interface (by alias), its chain (by
    comment)."""
    key = backend._key(sb.id)
    found = [f"interface {name}" for name in os.listdir("/sys/class/net")
             if name.startswith(local_netns.IFACE_PREFIX) and local_netns._alias(name) == key]
    listing = subprocess.run(["nft", "list", "table", "inet", local_netns.TABLE], capture_output=True, text=True)
    if f'comment "{key}"' in listing.stdout:
        found.append("its nftables chain")
    return found


def slot_of(sb: BackendSandbox) -> int:
    slot = LocalHandle.model_validate(sb.handle).net_slot
    assert slot is not None
    return slot


# ---- what an allowlist reaches ------------------------------------------------------------------------

async def test_an_allowlisted_address_and_port_answer_and_nothing_else(backend, test_address):
    own = host_address()
    with (tcp_server(test_address) as allowed, tcp_server(test_address) as other,
          tcp_server("127.0.0.1") as host_loopback, tcp_server(own) as host_own):
        async with allowlisted(backend, [f"{test_address}:{allowed}"]) as (sb, agent):
            assert await reaches(agent, test_address, allowed)
            assert not await reaches(agent, test_address, other)  # same address, another port
            assert not await reaches(agent, "1.1.1.1", 80)
            assert not await reaches(agent, "127.0.0.1", host_loopback)  # the sandbox's own loopback
            assert not await reaches(agent, own, host_own)  # the host's own address
            host_end, _ = local_netns.addresses(slot_of(sb), local_netns.subnet())
            assert not await reaches(agent, host_end, host_own)  # the host's end of the veth pair
            # The workload has no capabilities: it cannot give itself more.
            r = await agent.exec("ip route add 198.51.100.0/24 dev eth0 2>&1; ip link set eth0 down 2>&1")
            assert "Operation not permitted" in r.stdout, r.stdout
            assert await reaches(agent, test_address, allowed)


async def test_another_machine_is_reached_through_the_hosts_address(backend, remote):
    """Forwarded and masqueraded: the remote server sees the host's address on its link, not the
    sandbox's private one."""
    allowed, other = remote
    async with allowlisted(backend, [f"{REMOTE_ADDRESS}:{allowed}"]) as (_, agent):
        r = await agent.exec(["python3", "-c", SOURCE_PROBE, REMOTE_ADDRESS, str(allowed)], timeout=30)
        assert r.stdout.strip() == f"FROM {REMOTE_HOST_END}", (r.stdout, r.stderr)
        r = await agent.exec(["python3", "-c", SOURCE_PROBE, REMOTE_ADDRESS, str(other)], timeout=30)
        assert r.stdout.startswith("REFUSED"), r.stdout
    # The test's own check: without an allowance the same server is not reached either.
    async with allowlisted(backend, ["203.0.113.9"]) as (_, agent):
        assert not await reaches(agent, REMOTE_ADDRESS, allowed)


async def test_cidr_entries_and_entries_without_a_port(backend, test_address):
    own = host_address()
    with tcp_server(test_address) as first, tcp_server(test_address) as second, tcp_server(own) as host_own:
        async with allowlisted(backend, ["198.51.100.0/24"]) as (_, agent):
            assert await reaches(agent, test_address, first)
            assert await reaches(agent, test_address, second)
            assert not await reaches(agent, own, host_own)
        async with allowlisted(backend, [f"{own}/32:{host_own}"]) as (_, agent):
            assert await reaches(agent, own, host_own)  # the host itself, when explicitly allowed
            assert not await reaches(agent, test_address, first)


async def test_two_sandboxes_do_not_share_their_allowances_or_reach_each_other(backend, test_address):
    with tcp_server(test_address) as first, tcp_server(test_address) as second:
        async with (allowlisted(backend, [f"{test_address}:{first}"]) as (a, agent_a),
                    allowlisted(backend, [f"{test_address}:{second}", "10.0.0.0/8"]) as (b, agent_b)):
            assert slot_of(a) != slot_of(b)
            assert await reaches(agent_a, test_address, first)
            assert not await reaches(agent_a, test_address, second)
            assert await reaches(agent_b, test_address, second)
            assert not await reaches(agent_b, test_address, first)
            # b's allowlist covers the sandboxes' subnet, which stays closed all the same.
            await agent_a.exec("python3 -c 'import socket,time; s=socket.socket(); s.bind((\"0.0.0.0\", 8080)); "
                               "s.listen(); time.sleep(60)' >/dev/null 2>&1 &")
            _, address_a = local_netns.addresses(slot_of(a), local_netns.subnet())
            assert not await reaches(agent_b, address_a, 8080)


# ---- refusals -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry, message", [("pypi.org:443", "host name"), ("example.com", "host name"),
                                            ("[2001:db8::1]:443", "IPv6"), ("10.0.0.1:0", "invalid port")])
async def test_bad_entries_are_refused_before_anything_exists(backend, entry, message):
    before = set(os.listdir("/sys/class/net"))
    with pytest.raises(InvalidRequest, match=message):
        await backend.create("refused", SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=[entry])), "t")
    assert not (backend.root_dir / "refused").exists()
    assert set(os.listdir("/sys/class/net")) <= before


async def test_without_root_allowlist_is_refused_saying_why(backend, monkeypatch):
    monkeypatch.setattr(local_netns.os, "geteuid", lambda: 1000)
    assert "allowlist" not in local_capabilities().network_modes
    with pytest.raises(InvalidRequest, match="needs root"):
        await backend.create("noroot", SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=["10.0.0.1"])),
                             "t")
    assert not (backend.root_dir / "noroot").exists()
    monkeypatch.undo()
    monkeypatch.setattr(local_netns, "_tool", lambda name: None if name == "nft" else f"/usr/sbin/{name}")
    reason = local_netns.unavailable_reason() or ""
    assert "nft" in reason and "nftables" in reason
    assert "allowlist" not in local_capabilities().network_modes


# ---- nothing left behind ------------------------------------------------------------------------------

async def test_a_create_that_fails_in_its_rules_leaves_no_interface(backend, monkeypatch):
    monkeypatch.setattr(local_netns, "sandbox_rules", lambda *args: "add rule inet nowhere nothing\n")
    before = set(os.listdir("/sys/class/net"))
    with pytest.raises(BackendError, match="nft"):
        await backend.create("halfway", SandboxSpec(network=NetworkPolicy(mode="allowlist",
                                                                          allow=["10.0.0.1"])), "t")
    assert set(os.listdir("/sys/class/net")) <= before
    assert not (backend.root_dir / "halfway").exists()


async def test_a_create_that_fails_after_its_network_leaves_nothing(backend, monkeypatch):
    made: list[int] = []
    attach = local_netns.attach

    def recording_attach(*args, **kwargs):
        made.append(attach(*args, **kwargs))
        return made[-1]

    async def unhealthy(*args, **kwargs):
        while not made:  # fail only once the network is all there
            await asyncio.sleep(0.01)
        raise BackendError("the agent's /health answered 'nothing' (made to fail by the test)")

    monkeypatch.setattr(local_netns, "attach", recording_attach)
    monkeypatch.setattr(local_module, "check_health", unhealthy)
    with pytest.raises(BackendError, match="made to fail"):
        await backend.create("late", SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=["10.0.0.1"])),
                             "t")
    assert made and local_netns.iface(made[0]) not in os.listdir("/sys/class/net")
    assert leftovers(backend, BackendSandbox(id="late", agent_url="")) == []


async def test_sandboxes_that_died_unwatched_are_cleaned_by_the_next_orchestrator(backend):
    """The orchestrator is gone (no delete ran): one sandbox died with it, one kept running but its
    record lacks the slot (a crash right before recording it). A new backend on the same directory
    removes the dead one's rules and, deleting the other, finds its interface by alias."""
    spec = SandboxSpec(network=NetworkPolicy(mode="allowlist", allow=["10.0.0.1"]))
    dead = await backend.create("dead", spec, "t")
    alive = await backend.create("alive", spec, "t")
    handle = LocalHandle.model_validate(dead.handle)
    os.kill(handle.init_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process_running(handle.init_pid, handle.init_start) and time.monotonic() < deadline:
        time.sleep(0.01)
    meta = backend.root_dir / "alive" / "meta.json"
    record = json.loads(meta.read_text())
    record["handle"]["net_slot"] = None
    meta.write_text(json.dumps(record))

    restarted = LocalBackend(backend.root_dir, bundle_cache_dir=backend.bundle_cache_dir)
    live = await restarted.list_live()
    assert [sb.id for sb in live] == ["alive"]
    assert leftovers(restarted, dead) == []
    assert LocalHandle.model_validate(live[0].handle).net_slot is None
    await restarted.delete(live[0])
    assert leftovers(restarted, alive) == []
