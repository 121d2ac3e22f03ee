"""The model gateway in Kubernetes sandboxes (`network.gateway`): the backend's `model_gateway` is the
gateway's address as Pods reach it, `http://IP:PORT` (an address, since NetworkPolicy and the in-Pod egress
guard select by address). A sandbox asking for it gets
- an egress rule to exactly that IP and TCP port in its NetworkPolicy (netpol.py) and in its Pod's
  egress guard (egress.py), beside whatever else its network mode allows;
- the agent's forwarder (`--gateway tcp:IP:PORT`), so that inside, as on every backend, the gateway answers
  at 127.0.0.1:4000 and a harness's base URL does not depend on where it runs."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple
from urllib.parse import urlsplit

from orchard.sandbox.backends.kubernetes.pods import SANDBOX_CONTAINER


class GatewayAddress(NamedTuple):
    ip: str
    port: int

    @property
    def family(self) -> str:
        """nftables' address family keyword."""
        return "ip6" if ":" in self.ip else "ip"

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{128 if ':' in self.ip else 32}"

    @property
    def agent_target(self) -> str:
        return f"tcp:[{self.ip}]:{self.port}" if ":" in self.ip else f"tcp:{self.ip}:{self.port}"


def parse_model_gateway(value: str | None) -> GatewayAddress | None:
    """`http://IP:PORT` → GatewayAddress; ValueError for any other form."""
    if value is None:
        return None
    problem = (f"model_gateway {value!r} does not fit the kubernetes backend: give the gateway's address as Pods "
               "reach it, http://IP:PORT (an IP address, not a name: NetworkPolicy and the Pod's egress guard "
               "allow addresses; e.g. a Service's ClusterIP, or the node's IP for a gateway on the host)")
    try:
        parts = urlsplit(value)
        port = parts.port
        ip = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        raise ValueError(problem) from None
    if parts.scheme != "http" or port is None or parts.path not in ("", "/") or parts.query or parts.username:
        raise ValueError(problem)
    return GatewayAddress(str(ip), port)


def policy_rule(gateway: GatewayAddress) -> dict:
    """The NetworkPolicy egress rule that lets a Pod reach the gateway and nothing more."""
    return {"to": [{"ipBlock": {"cidr": gateway.cidr}}], "ports": [{"protocol": "TCP", "port": gateway.port}]}


def guard_rule(gateway: GatewayAddress) -> str:
    """The egress guard's nftables rule for the same."""
    return f"{gateway.family} daddr {gateway.ip} tcp dport {gateway.port} accept"


def add_forwarder(pod: dict, gateway: GatewayAddress) -> dict:
    """Start the sandbox container's agent with the forwarder to `gateway`."""
    for container in pod["spec"]["containers"]:
        if container["name"] == SANDBOX_CONTAINER:
            container["command"] = [*container["command"], "--gateway", gateway.agent_target]
    return pod
