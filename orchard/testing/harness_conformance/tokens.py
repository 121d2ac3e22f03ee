"""Token ids and logprobs: when the gateway has them (the conformance model returns them with every reply,
as a vLLM server asked for them does), every agent step of the trajectory leads to them: it names the
model call that produced it, and that call carries the ids and logprobs; a step that carries its own
carries the same."""

from __future__ import annotations

from orchard.testing.harness_conformance._rig import HarnessConformanceRig
from orchard.testing.harness_conformance.model import LOGPROB
from orchard.testing.harness_conformance.scenarios import SOLVE


class TokenChecks(HarnessConformanceRig):
    def test_token_ids_and_logprobs_reach_every_agent_step(self, conformance_run, request):
        self.applies(request)
        trajectory = conformance_run.trajectory(SOLVE)
        calls = {call.id: call for call in trajectory.llm_calls}
        assert calls, "the gateway recorded no model call for the solve rollout"
        for call in calls.values():
            assert call.error is None and call.completion_token_ids and call.prompt_token_ids, call.id
            assert call.logprobs == [LOGPROB] * len(call.completion_token_ids), (
                f"call {call.id}: the gateway's record lost the model's logprobs")
        steps = [step for step in trajectory.steps if step.source == "agent" and not step.is_copied_context]
        assert steps, "the solve trajectory has no agent step"
        for step in steps:
            assert step.llm_call_ids, (
                f"agent step {step.step_id} names no model call: record the response's id as "
                "extra['response_id'] (or the call ids as llm_call_ids) so the evaluator links the step to the "
                "gateway's record that holds its token ids")
            linked = [calls[call_id] for call_id in step.llm_call_ids]
            metrics = step.metrics
            if metrics is not None and metrics.completion_token_ids is not None:
                assert metrics.completion_token_ids == linked[-1].completion_token_ids, (
                    f"step {step.step_id} carries token ids other than its call's")
            if metrics is not None and metrics.logprobs is not None:
                assert metrics.logprobs == linked[-1].logprobs, f"step {step.step_id}: logprobs differ from its call's"
        assert len({call_id for step in steps for call_id in step.llm_call_ids}) == len(steps), (
            "two agent steps name the same model call: each reply is one step")
