"""The harness conformance suite: what every Orchard harness must do, checked by running it as `orchard eval`
runs it (the real evaluator, its gateway, embedded sandboxes) on three small tasks, against a stand-in model
that plays each task's scenario through the harness's own shell and submit tools (model.py):

    solve        one shell command writes a file, then submit: the task is resolved and `submitted`
    deadline     a command that outlasts the agent's short deadline, again and again: the harness stops
                 itself before the deadline (`time_limit` or `timeout`) and says why
    model_error  every model call fails: the rollout is a `model_error`, not the agent's failed attempt

and once more on a sandbox double that is lost from the start (orchard.testing.memory_sandbox): the harness
raises an Orchard error or returns a `sandbox_error`. The checks: the trajectories are valid ATIF (the
independent validator of orchard.testing.atif_spec) and read back the same, every tool call is paired with
its observation, the exit statuses above, token ids and logprobs reach every agent step (through the model
call it names), and errors are typed. One area to a module (trajectories, deadline, tokens, errors) on the
fixtures of `_rig.py`; `HarnessConformance` is all of them.

A harness runs it by subclassing `HarnessConformance` in a test module and naming itself:

    class TestReact(HarnessConformance):
        harness = "react"

Class attributes: `harness` (a registered name or `module:Class`), `harness_options`, `image` (the tasks'
sandbox image), `backend`, `deadline_s` (the agent's time in every scenario: enough to start and solve a
one-command task on a busy machine), `not_applicable` (test name -> why it cannot apply; the test is
skipped saying so). The fixture `orchard_home` is the Orchard home the run uses (an in-sandbox harness's
bundle is built into its cache). The tests are synchronous: the evaluation runs on an event loop of the
suite's own. See docs/harness-conformance.md."""

from orchard.testing.harness_conformance._rig import ConformanceRun, HarnessConformanceRig, LostSandboxRun
from orchard.testing.harness_conformance.deadline import DeadlineChecks
from orchard.testing.harness_conformance.errors import ErrorChecks
from orchard.testing.harness_conformance.tokens import TokenChecks
from orchard.testing.harness_conformance.trajectories import TrajectoryChecks


class HarnessConformance(TrajectoryChecks, DeadlineChecks, TokenChecks, ErrorChecks):
    """Subclass in a test module (named Test...) and set `harness`."""


__all__ = ["ConformanceRun", "HarnessConformance", "HarnessConformanceRig", "LostSandboxRun"]
