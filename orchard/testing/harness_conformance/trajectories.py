"""The trajectory a harness returns: the solve task resolved and submitted under the harness's own name and
version, valid ATIF in every scenario, every tool call answered by its observation."""

from __future__ import annotations

from orchard.core.atif import from_atif, to_atif
from orchard.core.trajectory import Trajectory
from orchard.testing.atif_spec import validate_atif
from orchard.testing.harness_conformance._rig import HarnessConformanceRig
from orchard.testing.harness_conformance.scenarios import DEADLINE, SCENARIOS, SOLVE


class TrajectoryChecks(HarnessConformanceRig):
    def test_the_solve_task_is_resolved_and_submitted(self, conformance_run, request):
        self.applies(request)
        row, trajectory = conformance_run.row(SOLVE), conformance_run.trajectory(SOLVE)
        assert (row.status, trajectory.exit_status) == ("resolved", "submitted"), (
            f"the harness ran one shell command and submitted, but the rollout ended {row.status} / "
            f"{trajectory.exit_status}: {row.error or trajectory.notes}")
        harness = conformance_run.harness
        assert (trajectory.agent.name, trajectory.agent.version) == (harness.name, harness.version)
        commands = [call for step in trajectory.steps for call in step.tool_calls]
        assert commands or any("hello.txt" in str(step.message) for step in trajectory.steps if step.source == "agent"), (
            "the solve trajectory shows neither a tool call nor the command the model sent")

    def test_every_trajectory_is_valid_atif_and_round_trips(self, conformance_run, request):
        self.applies(request)
        for scenario in SCENARIOS:
            trajectory = conformance_run.trajectory(scenario)
            document = to_atif(trajectory)
            validate_atif(document)  # the independent validator, written from ATIF's RFC
            assert from_atif(document) == trajectory, f"{scenario}: the ATIF export does not read back the same"

    def test_every_tool_call_is_paired_with_its_observation(self, conformance_run, request):
        """In every step, each tool call has a result naming it, and each result names a call of its step;
        only the last step of a rollout stopped at its deadline may lack results (its command was running)."""
        self.applies(request)
        for scenario in SCENARIOS:
            trajectory = conformance_run.trajectory(scenario)
            steps = _own_steps(trajectory)
            if scenario == DEADLINE and steps and not _answered(steps[-1]):
                steps = steps[:-1]
            for step in steps:
                calls = [call.tool_call_id for call in step.tool_calls]
                answered = [result.source_call_id for result in (step.observation.results if step.observation else [])]
                assert sorted(set(calls)) == sorted(set(answered) & set(calls)), (
                    f"{scenario}: step {step.step_id} made tool calls {calls} but has results for {answered}")
                stray = [call_id for call_id in answered if call_id is not None and call_id not in calls]
                assert not stray, f"{scenario}: step {step.step_id} has results for calls it did not make: {stray}"
        assert any(step.tool_calls for step in _own_steps(conformance_run.trajectory(SOLVE))), (
            "the solve trajectory has no tool call: the pairing was not exercised (the conformance model acts "
            "through the harness's shell tool)")


def _own_steps(trajectory: Trajectory) -> list:
    return [step for step in trajectory.steps if step.source == "agent" and not step.is_copied_context]


def _answered(step) -> bool:
    return not step.tool_calls or bool(step.observation and step.observation.results)
