"""Network `allowlist` on the local backend: the sandbox's own network namespace (bwrap's) gets one veth
pair to the host, and the host forwards only what the allowlist names.

Per sandbox, in the host's network namespace (root only):
- a veth pair: `orchard-a<N>` on the host (its alias is the sandbox's key), `eth0` in the sandbox, a /31
  of the allowlist subnet (`ORCHARD_LOCAL_ALLOWLIST_SUBNET`, default DEFAULT_SUBNET) for the two ends and
  the sandbox's default route via the host's end. The interface is the address lease: slot N is taken
  while `orchard-a<N>` exists, and the kernel removes the pair with the sandbox's namespace;
- in the nftables table `inet orchard_allowlist`, the chain `sandbox-<N>` (its comment is the sandbox's
  key) accepting the allowlisted destinations (TCP and UDP to the port when the entry names one), reached
  through the map `sandboxes` from the interface's name.
Shared by every sandbox: the table's base chains. Whatever a sandbox sends (input: to the host itself;
forward: elsewhere) goes through `from_sandbox`: replies of allowed connections pass, the subnet (the host
ends, other sandboxes) is refused, then the sandbox's own chain accepts what it allows and the rest is
refused (ICMP admin-prohibited: connect() fails at once). Nothing from outside may open a connection to a
sandbox, and what leaves the host is masqueraded. IPv4 forwarding is switched on (as container engines
do); IPv6 is not routed: turning its forwarding on would make the host ignore router advertisements.

Slots are chosen and released under one lock file for the whole machine (several orchestrators share the
table). The workload has no capabilities, so it can change neither its own namespace's routes nor the
host's rules. See docs/local-backend.md#network-allowlist."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Iterator

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import NetworkPolicy
from orchard.sandbox.backends.net_allow import parse_allow_entry

SUBNET_ENV = "ORCHARD_LOCAL_ALLOWLIST_SUBNET"
DEFAULT_SUBNET = "10.213.0.0/16"
IFACE_PREFIX = "orchard-a"
SANDBOX_IFACE = "eth0"
TABLE = "orchard_allowlist"
SANDBOX_MAP = "sandboxes"
FROM_SANDBOX = "from_sandbox"
CHAIN_PREFIX = "sandbox-"
LOCK_NAME = "orchard-allowlist.lock"
SYS_NET = Path("/sys/class/net")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = {"ip": "iproute2", "nft": "nftables", "nsenter": "util-linux"}
COMMAND_TIMEOUT_S = 30.0


def _tool(name: str) -> str | None:
    return shutil.which(name, path=TOOL_PATH)


def unavailable_reason() -> str | None:
    """Why this process cannot give sandboxes an allowlist, or None when it can."""
    if os.geteuid() != 0:
        return ("network 'allowlist' on the local backend needs root: it adds a veth pair and nftables rules "
                "in the host's network namespace; run the orchestrator as root, or use mode 'none'/'open' "
                "or the kubernetes backend")
    missing = [name for name in TOOLS if _tool(name) is None]
    if missing:
        return (f"network 'allowlist' on the local backend needs the commands {', '.join(missing)}, not found "
                f"on this machine; install {' '.join(TOOLS[name] for name in missing)} (Debian packages; "
                "scripts/setup-system.sh installs them)")
    return None


def subnet() -> ipaddress.IPv4Network:
    text = os.environ.get(SUBNET_ENV) or DEFAULT_SUBNET
    try:
        network = ipaddress.IPv4Network(text)
    except ValueError:
        network = None
    if network is None or network.prefixlen > 30:
        raise BackendError(f"{SUBNET_ENV}={text!r} is not an IPv4 network of at least 4 addresses "
                           f"(e.g. {DEFAULT_SUBNET}); it holds one /31 per sandbox with an allowlist")
    return network


def routed(network: NetworkPolicy) -> NetworkPolicy | None:
    """The allowlist a sandbox's veth pair enforces, None for a sandbox without one. Mode `allowlist` is
    its own; `open` with the model gateway is routed too, allowing every IPv4 address: an open sandbox
    otherwise shares the host's network namespace, where its own 127.0.0.1:4000 (the gateway) cannot exist."""
    if network.mode == "allowlist":
        return network
    if network.mode == "open" and network.gateway:
        return NetworkPolicy(mode="allowlist", allow=["0.0.0.0/0"])
    return None


def check_network(network: NetworkPolicy) -> None:
    """InvalidRequest for an allowlist (or a routed open network) this machine cannot give, before anything
    is made."""
    if routed(network) is None:
        return
    if network.mode == "open":
        reason = unavailable_reason()
        if reason:
            raise InvalidRequest(f"network.gateway with mode 'open' routes the sandbox through a namespace of its "
                                 f"own (the host's, which open shares otherwise, cannot hold its 127.0.0.1:4000), "
                                 f"which this machine cannot do: {reason}")
        return
    for entry in network.allow:
        cidr, _ = parse_allow_entry(entry)  # refuses host names, as every backend does
        if ipaddress.ip_network(cidr).version == 6:
            raise InvalidRequest(f"network.allow entry {entry!r} is IPv6: the local backend routes its "
                                 "sandboxes over IPv4 only (turning IPv6 forwarding on would make the host "
                                 "ignore router advertisements); allow IPv4 addresses, or use the kubernetes "
                                 "backend")
    reason = unavailable_reason()
    if reason:
        raise InvalidRequest(reason)


# ---- addresses and names ---------------------------------------------------------------------------

def iface(slot: int) -> str:
    return f"{IFACE_PREFIX}{slot}"


def chain(slot: int) -> str:
    return f"{CHAIN_PREFIX}{slot}"


def addresses(slot: int, pool: ipaddress.IPv4Network) -> tuple[str, str]:
    """(host end, sandbox end) of slot N's /31."""
    return str(pool[2 * slot]), str(pool[2 * slot + 1])


def _slots_in_use() -> dict[int, str | None]:
    """Slot → the key in its interface's alias (None when unreadable), from sysfs (no command run)."""
    found: dict[int, str | None] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(SYS_NET):
            suffix = name[len(IFACE_PREFIX):]
            if name.startswith(IFACE_PREFIX) and suffix.isdigit():
                found[int(suffix)] = _alias(name)
    return found


def _alias(name: str) -> str | None:
    """The interface's alias ("" when it has none), None when there is no such interface."""
    try:
        return (SYS_NET / name / "ifalias").read_text().strip()
    except OSError:
        return None


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Held while slots are taken or given back and while the table changes, by every orchestrator."""
    base = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/run")
    fd = os.open(base / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run(argv: list[str], stdin: str = "", what: str = "") -> str:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              env={"PATH": TOOL_PATH})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BackendError(f"{what or argv[0]} failed: {e}") from e
    if done.returncode != 0:
        raise BackendError(f"{what or argv[0]} failed: {(done.stderr or done.stdout).strip()[:2000]}")
    return done.stdout


def _nft(script: str, what: str) -> str:
    return _run([_tool("nft") or "nft", "-f", "-"], script, f"nft ({what})")


def _ip_batch(commands: list[str], what: str, netns_pid: int | None = None) -> None:
    argv = [_tool("ip") or "ip", "-batch", "-"]
    if netns_pid is not None:
        argv = [_tool("nsenter") or "nsenter", f"--net=/proc/{netns_pid}/ns/net", "--", *argv]
    _run(argv, "".join(f"{c}\n" for c in commands), f"ip ({what})")


# ---- the rules ---------------------------------------------------------------------------------------

def base_rules(pool: ipaddress.IPv4Network) -> str:
    """The shared chains, (re)written whole in every transaction that adds a sandbox: idempotent, and a
    changed subnet takes effect. Other sandboxes' chains and map entries are untouched."""
    t = f"inet {TABLE}"
    ours = f'"{IFACE_PREFIX}*"'
    lines = [
        f"add table {t}",
        f"add map {t} {SANDBOX_MAP} {{ type ifname : verdict; }}",
        f"add chain {t} {FROM_SANDBOX}",
        f"add chain {t} input {{ type filter hook input priority filter; policy accept; }}",
        f"add chain {t} forward {{ type filter hook forward priority filter; policy accept; }}",
        f"add chain {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}",
        *(f"flush chain {t} {c}" for c in (FROM_SANDBOX, "input", "forward", "postrouting")),
        f"add rule {t} input iifname {ours} jump {FROM_SANDBOX}",
        f"add rule {t} forward iifname {ours} jump {FROM_SANDBOX}",
        # Into a sandbox: only the replies of connections it opened.
        f"add rule {t} forward oifname {ours} ct state established,related accept",
        f"add rule {t} forward oifname {ours} drop",
        f"add rule {t} {FROM_SANDBOX} ct state established,related accept",
        # The host's ends and every other sandbox, whatever an allowlist's CIDR covers.
        f"add rule {t} {FROM_SANDBOX} ip daddr {pool} reject with icmpx type admin-prohibited",
        f"add rule {t} {FROM_SANDBOX} iifname vmap @{SANDBOX_MAP}",
        # Refused, not dropped: the workload's connect() fails now instead of at its timeout.
        f"add rule {t} {FROM_SANDBOX} reject with icmpx type admin-prohibited",
        f"add rule {t} postrouting ip saddr {pool} ip daddr != {pool} masquerade",
    ]
    return "".join(f"{line}\n" for line in lines)


def _remove_sandbox_rules(slot: int) -> list[str]:
    """Removes slot N's map entry and chain whether or not they exist (each is added first: nft has no
    'delete if present' before 1.0.8)."""
    t, c = f"inet {TABLE}", chain(slot)
    return [f"add chain {t} {c}",
            f'add element {t} {SANDBOX_MAP} {{ "{iface(slot)}" : jump {c} }}',
            f'delete element {t} {SANDBOX_MAP} {{ "{iface(slot)}" }}',
            f"delete chain {t} {c}"]


def sandbox_rules(slot: int, key: str, sandbox_address: str, network: NetworkPolicy) -> str:
    t, c = f"inet {TABLE}", chain(slot)
    lines = [*_remove_sandbox_rules(slot),  # a leftover of an earlier holder of the slot
             f'add chain {t} {c} {{ comment "{key}"; }}',
             # Only the sandbox's own address (it cannot forge others without CAP_NET_RAW; belt and braces).
             f"add rule {t} {c} ip saddr != {sandbox_address} drop"]
    for entry in network.allow:
        cidr, port = parse_allow_entry(entry)
        if port is None:
            lines.append(f"add rule {t} {c} ip daddr {cidr} accept")
        else:
            lines += [f"add rule {t} {c} ip daddr {cidr} {proto} dport {port} accept"
                      for proto in ("tcp", "udp")]
    lines.append(f'add element {t} {SANDBOX_MAP} {{ "{iface(slot)}" : jump {c} }}')
    return "".join(f"{line}\n" for line in lines)


# ---- attach / detach -------------------------------------------------------------------------------

def _ensure_forwarding() -> None:
    try:
        if IP_FORWARD.read_text().strip() != "1":
            IP_FORWARD.write_text("1")
    except OSError as e:
        raise BackendError(f"network 'allowlist' needs IPv4 forwarding and it could not be switched on "
                           f"({e}); run `sysctl -w net.ipv4.ip_forward=1` as root") from e


def attach(key: str, pid: int, network: NetworkPolicy, on_claim: Callable[[int], None]) -> int:
    """Give the sandbox whose network namespace is that of `pid` its veth pair and rules; returns its slot,
    reported to `on_claim` as soon as it is taken (to be recorded before anything else is made). On
    failure everything made here is removed again."""
    pool = subnet()
    _ensure_forwarding()
    with _machine_lock():
        taken = _slots_in_use()
        slot = next((n for n in range(pool.num_addresses // 2) if n not in taken), None)
        if slot is None:
            raise BackendError(f"no free address for one more sandbox with an allowlist: {pool} holds "
                               f"{pool.num_addresses // 2}; set {SUBNET_ENV} to a larger private network")
        host_end, sandbox_end = addresses(slot, pool)
        name = iface(slot)
        try:
            _ip_batch([f"link add {name} type veth peer name {SANDBOX_IFACE} netns {pid}",
                       f"link set dev {name} alias {key} addrgenmode none",
                       f"addr add {host_end}/31 dev {name}",
                       f"link set dev {name} up"], "the sandbox's veth pair")
            on_claim(slot)
            _nft(base_rules(pool) + sandbox_rules(slot, key, sandbox_end, network), "the sandbox's allowlist")
        except BaseException:
            _release(slot, key, made_here=True)
            raise
    try:
        _ip_batch([f"link set dev {SANDBOX_IFACE} addrgenmode none",
                   f"addr add {sandbox_end}/31 dev {SANDBOX_IFACE}",
                   f"link set dev {SANDBOX_IFACE} up",
                   f"route add default via {host_end}"], "the sandbox's end", netns_pid=pid)
    except BaseException:
        detach(key, slot)
        raise
    return slot


def start_attach(key: str, pid: int, network: NetworkPolicy,
                 on_claim: Callable[[int], None]) -> "Future[int]":
    """`attach` on a thread of its own, so that it overlaps the agent's start. The returned future cannot
    be cancelled (an awaiting task's cancellation would otherwise cancel it too), so it can always be
    waited for (`.exception()`) before the sandbox is removed."""
    future: Future[int] = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(attach(key, pid, network, on_claim))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(e)

    threading.Thread(target=run, name="orchard-allowlist", daemon=True).start()
    return future


def find_slot(key: str) -> int | None:
    """The slot whose interface carries `key` (for a create that crashed before recording its slot); look
    before the sandbox is killed: its interface goes with its namespace."""
    return next((n for n, alias in _slots_in_use().items() if alias == key), None)


def detach(key: str, slot: int | None) -> None:
    """Remove what `attach` made for the sandbox with `key`: its interface (unless the slot is another
    sandbox's by now), its chain and map entry. `slot` None: found by the interface's alias, else left to
    `clean_orphans`. Safe to repeat."""
    if slot is None:
        slot = find_slot(key)
        if slot is None:
            return
    with _machine_lock():
        _release(slot, key)


def _release(slot: int, key: str, made_here: bool = False) -> None:
    """Under the machine lock. `made_here`: by an `attach` that failed, maybe before naming the interface."""
    alias = _alias(iface(slot))
    ours = alias == key or (made_here and alias == "")
    if alias is not None and not ours:
        return  # the slot was given back and taken again: both are the new holder's
    deleting = None
    if ours:
        # Beside the nft transaction: each waits ~15-20 ms for the kernel (RCU), not for the CPU. A
        # failure means the pair went meanwhile with the sandbox's namespace.
        deleting = subprocess.Popen([_tool("ip") or "ip", "link", "del", iface(slot)], env={"PATH": TOOL_PATH},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    others = [n for n in _slots_in_use() if n != slot]
    try:
        _nft_release(slot, last=not others)
    finally:
        if deleting is not None:
            deleting.wait()


def _nft_release(slot: int, last: bool) -> None:
    if last:
        lines = [f"add table inet {TABLE}", f"delete table inet {TABLE}"]  # the last sandbox: nothing stays
    else:
        lines = [f"add table inet {TABLE}", f"add map inet {TABLE} {SANDBOX_MAP} {{ type ifname : verdict; }}",
                 *_remove_sandbox_rules(slot)]
    _nft("".join(f"{line}\n" for line in lines), "removing the sandbox's allowlist")


def clean_orphans() -> list[int]:
    """Remove the chains of slots whose interface is gone (their sandbox died while no orchestrator
    watched), and the table once no sandbox uses it. Returns the slots cleaned."""
    if unavailable_reason() is not None:
        return []
    with _machine_lock():
        try:
            listing = json.loads(_run([_tool("nft") or "nft", "-j", "list", "table", "inet", TABLE],
                                      what="nft (listing the allowlist table)"))
        except BackendError:
            return []  # no table: nothing to clean
        except ValueError as e:
            raise BackendError(f"nft -j printed something that is not JSON: {e}") from e
        chains = [item["chain"]["name"] for item in listing.get("nftables", []) if "chain" in item]
        slots = [int(n[len(CHAIN_PREFIX):]) for n in chains
                 if n.startswith(CHAIN_PREFIX) and n[len(CHAIN_PREFIX):].isdigit()]
        in_use = _slots_in_use()
        orphans = [slot for slot in slots if slot not in in_use]
        if not in_use:
            _nft(f"delete table inet {TABLE}\n", "removing the unused allowlist table")
        elif orphans:
            _nft("".join(f"{line}\n" for slot in orphans for line in _remove_sandbox_rules(slot)),
                 "removing orphaned allowlist rules")
        return orphans
