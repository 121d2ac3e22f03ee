"""The OpenHands SDK's harness bundle: a library, so its entry is the bundle's Python (the adapter runs its
driver script with it). The SDK prints a banner on import unless told not to, and its litellm fetches a
model cost map from GitHub on import (retrying for seconds under model-only networking) unless told to use
its own copy."""

from orchard.core.harness_bundle import HarnessBundleSpec

SDK_VERSION = "1.58.2"

SPEC = HarnessBundleSpec(
    name="openhands",
    python="3.13",
    requirements=[f"openhands-sdk=={SDK_VERSION}", f"openhands-tools=={SDK_VERSION}"],
    entry=["python"],
    env={"OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
)
