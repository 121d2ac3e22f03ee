"""Per-rollout API keys: a credential a sandbox can hold for its own rollout only.

A harness inside a sandbox is given the base URL `.../r/<rollout key>/v1` and an API key. Handing it the
gateway's own key would let it bill calls to, read or end any rollout; instead it gets
`rollout_api_key(gateway key, rollout key)`, an HMAC the gateway recomputes, accepted on that rollout's
`/r/<rollout key>/v1/...` routes and nowhere else. Nothing is stored: the gateway's key is the only secret."""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "orr-"  # tells a rollout key apart from a gateway key in logs and error reports


def rollout_api_key(gateway_key: str, rollout_key: str) -> str:
    digest = hmac.new(gateway_key.encode(), b"orchard-rollout\0" + rollout_key.encode(), hashlib.sha256)
    return PREFIX + digest.hexdigest()


def is_rollout_api_key(given: str, gateway_key: str, rollout_key: str) -> bool:
    return hmac.compare_digest(given.encode(), rollout_api_key(gateway_key, rollout_key).encode())
