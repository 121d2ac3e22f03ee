"""The adapter's versions. `PROFILE_VERSION` is what `orchard harness list` shows and what the profile's
trajectories record: this distribution's version with `+zeroclaw-profile.<the ZeroClaw release it follows>`,
so a listing never passes the profile off as the real binary. A run of the real binary records its own
version string (real/harness.py)."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "orchard-zeroclaw"
ZEROCLAW_RELEASE = "0.8.4"  # the ZeroClaw release whose tools, prompt layout and gateway frames are followed

try:
    DIST_VERSION = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree that was not installed
    DIST_VERSION = "0.1.0"

PROFILE_VERSION = f"{DIST_VERSION}+zeroclaw-profile.{ZEROCLAW_RELEASE}"
