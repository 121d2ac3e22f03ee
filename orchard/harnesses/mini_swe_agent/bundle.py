"""mini-swe-agent's own `mini` CLI as a harness bundle, for running it inside the sandbox like any other CLI
agent (the `mini-swe-agent` harness itself runs the package's loop in Orchard's process instead). The pin
follows the one Orchard's own dependency range allows. Its litellm uses its own copy of the model cost map
instead of fetching it (no route out under model-only networking)."""

from orchard.core.harness_bundle import HarnessBundleSpec

SPEC = HarnessBundleSpec(
    name="mini-swe-agent",
    python="3.13",
    requirements=["mini-swe-agent==2.4.6"],
    entry=["mini"],
    env={"MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
)
