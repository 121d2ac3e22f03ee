"""Kimi-CLI's harness bundle. Pinned to 1.51.0, the last real CLI: 1.52.0 is a deprecation stub that prints
"no longer maintained" and, run without arguments, downloads and runs an installer script. Its Grep tool
runs ripgrep, which the bundle carries (`{bundle}/bin/rg`)."""

from orchard.core.harness_bundle import HarnessBundleSpec

SPEC = HarnessBundleSpec(
    name="kimi-cli",
    python="3.13",
    requirements=["kimi-cli==1.51.0"],
    debian_packages=["ripgrep"],
    entry=["kimi"],
    env={"KIMI_DISABLE_TELEMETRY": "1", "KIMI_CLI_NO_AUTO_UPDATE": "1"},
)
