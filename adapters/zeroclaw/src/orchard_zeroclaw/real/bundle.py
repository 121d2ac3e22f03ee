"""The harness bundle the real binary's driver runs from when the binary comes from this machine
(`ZEROCLAW_BIN`): Debian's Python and nothing else. It gives the driver an interpreter whatever the task image
has, and, as for every harness that runs from a bundle, the evaluator gives the sandbox the run's gateway on
loopback. A bundle that carries ZeroClaw itself (`bundle=NAME`) is the user's; the driver then runs on that
bundle's Python."""

from orchard.core.harness_bundle import HarnessBundleSpec

SPEC = HarnessBundleSpec(name="zeroclaw", python="3.13", entry=["python"])
