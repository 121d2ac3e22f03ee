"""Egress enforced inside the Pod, so network modes hold on any CNI (NetworkPolicy alone needs a
policy-capable one: a plain `bridge` CNI stores the objects and enforces nothing).

For network "none" and "allowlist" the Pod's first init container, the egress guard, installs an nftables
table in the Pod's network namespace, the one every container of the Pod shares, before the agent
injector and the workload start. It runs the agent-injector image (its `/egress/apply` wraps an `nft`
with its own libraries and loader, see images.py) with every capability dropped except NET_ADMIN,
which no later container has: the sandbox container drops NET_ADMIN and NET_RAW (a raw AF_PACKET socket
would send frames past netfilter). The table's only chain hooks `output` with policy drop and accepts:
- loopback (the sandbox's own services, its own Pod IP);
- replies from the agent's port to connections made to it (orchestrator, clients, the kubelet's probe):
  ingress is not filtered, and a reply is the only packet an incoming connection needs from the Pod;
- IPv6 neighbour discovery on the link (hop limit 255), without which no IPv6 peer could reach it;
- for "allowlist", each entry's addresses (and its port, TCP and UDP, when it names one);
- with `network.gateway`, the model gateway's address and TCP port (gateway.py).
Everything else the Pod sends is refused by the Pod's own kernel: a TCP connect() fails at once with
EHOSTUNREACH (an ICMP "administratively prohibited" delivered locally), a UDP send with EPERM.
"open" gets no guard. Host names stay refused by `net_allow.parse_allow_entry`, here as everywhere."""

from __future__ import annotations

from orchard.core.sandbox import NetworkPolicy
from orchard.sandbox.backends.kubernetes.gateway import GatewayAddress, guard_rule
from orchard.sandbox.backends.net_allow import parse_allow_entry
from orchard.sandbox.backends.kubernetes.pods import AGENT_PORT

GUARD_CONTAINER = "egress-guard"
# Inside the agent-injector image: the nft binary, its libraries and loader, and the script running it.
EGRESS_DIR = "/egress"
APPLY_SCRIPT = f"{EGRESS_DIR}/apply"
TABLE = "orchard"
CHAIN = "egress"


def egress_ruleset(network: NetworkPolicy, agent_port: int = AGENT_PORT,
                   gateway: GatewayAddress | None = None) -> str | None:
    """The nft ruleset (one transaction) for the Pod's network namespace, or None for mode "open".
    `gateway`: the model gateway's address, allowed when the network asks for it."""
    if network.mode == "open":
        return None
    rules = [
        'oifname "lo" accept',
        f"tcp sport {agent_port} ct state established ct direction reply accept",
        "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } ip6 hoplimit 255 accept",
    ]
    for entry in network.allow:
        cidr, port = parse_allow_entry(entry)
        family = "ip6" if ":" in cidr else "ip"
        if port is None:
            rules.append(f"{family} daddr {cidr} accept")
        else:
            rules += [f"{family} daddr {cidr} {proto} dport {port} accept" for proto in ("tcp", "udp")]
    if network.gateway and gateway is not None:
        rules.append(guard_rule(gateway))
    # Refused at once rather than dropped: the workload's connect() fails now (EHOSTUNREACH, "No route
    # to host") instead of hanging until its timeout. The chain's policy drops anything the reject misses.
    rules.append("reject with icmpx type admin-prohibited")
    body = "".join(f"    {rule}\n" for rule in rules)
    return (f"table inet {TABLE} {{\n  chain {CHAIN} {{\n"
            f"    type filter hook output priority 0; policy drop;\n{body}  }}\n}}\n")


def guard_container(network: NetworkPolicy, image: str, image_pull_policy: str,
                    gateway: GatewayAddress | None = None) -> dict | None:
    """The init container that installs `egress_ruleset` (None for mode "open"). Its log is the table in
    force (`kubectl logs POD -c egress-guard`)."""
    ruleset = egress_ruleset(network, gateway=gateway)
    if ruleset is None:
        return None
    return {
        "name": GUARD_CONTAINER,
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": [APPLY_SCRIPT, ruleset],
        "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsUser": 0},
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                      "limits": {"cpu": "1", "memory": "64Mi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
