"""The deadline: a harness whose model keeps it waiting on a command stops itself before the evaluator's
deadline (`ModelConfig.deadline`), and says so, instead of being cut off there."""

from __future__ import annotations

from orchard.testing.harness_conformance._rig import HarnessConformanceRig
from orchard.testing.harness_conformance.scenarios import DEADLINE

STOP_STATUSES = ("time_limit", "timeout")  # its own wall-time limit, or the deadline it stopped before


class DeadlineChecks(HarnessConformanceRig):
    def test_a_short_deadline_stops_the_harness_before_it_and_it_says_so(self, conformance_run, request):
        self.applies(request)
        trajectory = conformance_run.trajectory(DEADLINE)
        (agent,) = [phase for phase in trajectory.phases if phase.name == "agent"]
        assert agent.timeout_s is not None and agent.duration_s < agent.timeout_s, (
            f"the harness ran {agent.duration_s:.1f} s of its {agent.timeout_s} s: the evaluator cut it off at its "
            "deadline instead of the harness stopping before it (read ModelConfig.deadline, or time_left_s(), "
            "and leave a margin: orchard/harnesses/deadline.py)")
        said = trajectory.notes or (trajectory.outcome.error if trajectory.outcome else None)
        assert trajectory.exit_status in STOP_STATUSES and said, (
            f"the harness stopped in time but ended {trajectory.exit_status!r} saying {said!r}; a stop at the "
            f"deadline is one of {STOP_STATUSES} with a note or error that says why")
        agent_steps = [step for step in trajectory.steps if step.source == "agent"]
        assert agent_steps, "the harness stopped before its model's first reply reached the trajectory"
