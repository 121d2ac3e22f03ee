"""NetworkPolicy manifests for sandbox egress.

One namespace-wide policy selects every Pod and allows no egress at all (network "none" is the default).
NetworkPolicies are additive allowlists, so a sandbox with network "allowlist" or "open" gets one more
policy of its own, selecting only its Pod by label:
- "allowlist": one egress rule per entry, an `ipBlock` (a CIDR, or an IP as /32 or /128) with its TCP
  and UDP port when the entry has one;
- "open": a single empty egress rule (everything).
NetworkPolicy selects by address only, so host names are refused (InvalidRequest, by the entry parser every
backend shares, net_allow.py). Only a policy-capable CNI (Calico, Cilium, ...) enforces these objects;
"none" and "allowlist" are also enforced inside each Pod by the egress guard (egress.py), which needs
no such CNI."""

from __future__ import annotations

from orchard.core.sandbox import NetworkPolicy
from orchard.sandbox.backends.kubernetes.gateway import GatewayAddress, policy_rule
from orchard.sandbox.backends.net_allow import parse_allow_entry
from orchard.sandbox.backends.kubernetes.pods import (MANAGED_BY, MANAGED_BY_VALUE, SANDBOX_LABEL, policy_name,
                                                      sandbox_labels)

DENY_ALL_EGRESS = "orchard-deny-all-egress"


def deny_all_egress_manifest() -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": DENY_ALL_EGRESS, "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []}}


def sandbox_policy_manifest(sandbox_id: str, instance: str, network: NetworkPolicy,
                            gateway: GatewayAddress | None = None) -> dict | None:
    """The sandbox's own egress policy, or None for mode "none" (the namespace-wide deny applies) without
    the model gateway. `gateway`: its address, allowed when the network asks for it (gateway.py)."""
    with_gateway = [policy_rule(gateway)] if network.gateway and gateway is not None else []
    if network.mode == "none" and not with_gateway:
        return None
    if network.mode == "open":
        egress = [{}]
    else:
        egress = []
        for entry in network.allow:
            cidr, port = parse_allow_entry(entry)
            rule: dict = {"to": [{"ipBlock": {"cidr": cidr}}]}
            if port is not None:
                rule["ports"] = [{"protocol": "TCP", "port": port}, {"protocol": "UDP", "port": port}]
            egress.append(rule)
        egress += with_gateway
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": policy_name(sandbox_id), "labels": sandbox_labels(sandbox_id, instance)},
            "spec": {"podSelector": {"matchLabels": {SANDBOX_LABEL: sandbox_id}},
                     "policyTypes": ["Egress"], "egress": egress}}


def validate_network(network: NetworkPolicy) -> None:
    """Raise InvalidRequest for entries a NetworkPolicy cannot express, before anything is created."""
    for entry in network.allow:
        parse_allow_entry(entry)
