"""The entries of a network `allowlist` (`NetworkPolicy.allow`), as every backend reads them.

An entry is `CIDR`, `IP`, `IP:PORT` or `[IPv6]:PORT`; a port allows TCP and UDP to it. Host names are
refused: backends filter packets by address, and a name resolved once at creation would silently go
stale when it moves."""

from __future__ import annotations

import ipaddress

from orchard.core.errors import InvalidRequest


def parse_allow_entry(entry: str) -> tuple[str, int | None]:
    """`CIDR`, `IP`, `IP:PORT` or `[IPv6]:PORT` → (cidr, port). Host names raise InvalidRequest."""
    text = entry.strip()
    port: int | None = None
    host = text
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise InvalidRequest(f"network.allow entry {entry!r} is malformed; use [IPv6]:PORT")
        if rest:
            port = _port(rest[1:], entry)
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(port_text, entry)
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        raise InvalidRequest(
            f"network.allow entry {entry!r} is not an IP address or CIDR: sandboxes' egress is filtered by "
            "address only, so an allowlist cannot name a host name (resolved once, it would go stale when "
            "the name moves); give its addresses as CIDRs (e.g. '203.0.113.7/32:443') or use network mode "
            "'open'") from None
    return str(network), port


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidRequest(f"network.allow entry {entry!r} has an invalid port {text!r}; use 1-65535")
    return int(text)
