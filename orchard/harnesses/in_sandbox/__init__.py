"""The base of the harnesses whose agent runs inside the sandbox from a harness bundle (harness.py), what an
adapter declares for a run (descriptor.py) and the readers of native logs (native_log.py)."""

from orchard.harnesses.in_sandbox.descriptor import AgentRun, Ending, Finished, Launch, SandboxFile
from orchard.harnesses.in_sandbox.harness import InSandboxHarness

__all__ = ["AgentRun", "Ending", "Finished", "InSandboxHarness", "Launch", "SandboxFile"]
