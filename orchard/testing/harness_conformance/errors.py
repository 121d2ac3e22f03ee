"""Errors are typed: an infrastructure failure is the harness's error, never the agent's failed attempt. A
model whose every call fails (the gateway answers 502) ends the rollout as a `model_error`; a sandbox that is
lost makes the harness raise an Orchard error (`orchard.core.errors`) or return a trajectory with an error
outcome and the status `sandbox_error`, not crash with another exception nor report an agent outcome."""

from __future__ import annotations

from orchard.core.errors import OrchardError, exception_text
from orchard.core.run_status import is_agent_outcome
from orchard.testing.harness_conformance._rig import HarnessConformanceRig
from orchard.testing.harness_conformance.scenarios import MODEL_ERROR


class ErrorChecks(HarnessConformanceRig):
    def test_a_failing_model_is_a_model_error_not_an_attempt(self, conformance_run, request):
        self.applies(request)
        row, trajectory = conformance_run.row(MODEL_ERROR), conformance_run.trajectory(MODEL_ERROR)
        assert trajectory.exit_status == "model_error", (
            f"every model call failed, but the rollout ended {trajectory.exit_status!r} "
            f"({trajectory.notes or row.error}): a model API failure is exit_status 'model_error'")
        assert row.status == "error" and trajectory.outcome is not None and trajectory.outcome.error, row
        assert trajectory.llm_calls and all(call.error for call in trajectory.llm_calls), (
            "the gateway recorded no failed call: the harness did not reach the model")

    def test_a_lost_sandbox_is_an_orchard_error_not_an_attempt(self, lost_sandbox_run, request):
        self.applies(request)
        run = lost_sandbox_run
        assert run.sandbox.calls, "the harness never used its sandbox, so its losing it could not be checked"
        if run.raised is not None:
            assert isinstance(run.raised, OrchardError), (
                f"the sandbox was lost and the harness raised {type(run.raised).__name__}: "
                f"{exception_text(run.raised)}: raise (or let through) the sandbox's own Orchard error, or "
                "return the steps so far with exit_status 'sandbox_error'")
            return
        trajectory = run.trajectory
        assert trajectory is not None
        error = trajectory.outcome.error if trajectory.outcome else None
        assert error and trajectory.exit_status == "sandbox_error", (
            f"the sandbox was lost, but the harness returned exit_status {trajectory.exit_status!r} with error "
            f"{error!r}: a lost sandbox is an error outcome with exit_status 'sandbox_error'")
        assert not is_agent_outcome(trajectory.exit_status)
