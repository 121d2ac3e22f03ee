"""The OpenHands SDK's harness bundle: a library, so its entry is the bundle's Python (the adapter runs its
driver script with it). The SDK prints a banner on import unless told not to, and its litellm fetches a
model cost map from GitHub on import (retrying for seconds under model-only networking) unless told to use
its own copy. Its requirements are a lock (bundle-lock.txt, made by `orchard harness lock` from the two SDK
pins): pip took minutes backtracking over the SDK's ~185 dependencies, and installs the lock without resolving."""

from importlib.resources import files

from orchard.core.harness_bundle import HarnessBundleSpec, lock_pins

SDK_VERSION = "1.58.2"
TOP_LEVEL = [f"openhands-sdk=={SDK_VERSION}", f"openhands-tools=={SDK_VERSION}"]

SPEC = HarnessBundleSpec(
    name="openhands",
    python="3.13",
    requirements=lock_pins((files(__package__) / "bundle-lock.txt").read_text()),
    locked=True,
    entry=["python"],
    env={"OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
)
