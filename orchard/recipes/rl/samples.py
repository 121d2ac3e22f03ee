"""A graded rollout as one GRPO sample, from the gateway's records only (token in, token out).

The sample's prompt is the first call's prompt ids; its completion is everything after, in order: each
call's sampled ids (`env_mask` 1, trained, with the logprobs the policy reported) and, between calls, the
ids the next prompt added (the tool results and messages the harness sent, `env_mask` 0, not trained,
logprob 0). Call k+1's prompt must start with call k's prompt + completion — true by construction for
`TrainingPolicy` and for any server that continues from ids; where it does not (a harness rewrote its
history), the sample stops at the last consistent call and `drift` says where.

A rollout whose exit status is not an agent outcome (orchard.core.run_status) is an infrastructure error:
its sample is a placeholder with `reward` None, nothing trained, so GRPO leaves it out of its group's mean
and standard deviation (TRL: a None reward is NaN, excluded from the baseline, advantage 0). One exception:
a rollout the trial's deadline cut off while the policy kept answering (`timeout`, its model calls all
answered) is the policy's own doing, as its step, token and time limits are: a reward of 0, trained, so
that a policy that loops is penalized rather than excused. The evaluator still counts it as no attempt."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchard.core.run_status import is_agent_outcome
from orchard.core.trajectory import LLMCall, Trajectory


@dataclass
class RolloutSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float | None
    task_id: str | None = None
    rollout_key: str | None = None
    exit_status: str | None = None
    calls: int = 0
    drift: str | None = None
    notes: list[str] = field(default_factory=list)
    resolved: bool | None = None  # at the suite's pass threshold; the reward is the grader's score either way

    @property
    def trained_tokens(self) -> int:
        return sum(self.env_mask)


class NoTokenRecords(ValueError):
    """The rollout's calls carry no token ids: its model server did not return them."""


def placeholder(pad_id: int, *, task_id: str | None = None, rollout_key: str | None = None,
                exit_status: str | None = None, note: str = "") -> RolloutSample:
    """A slot that holds nothing to learn from: reward None, one untrained token."""
    return RolloutSample(prompt_ids=[pad_id], completion_ids=[pad_id], logprobs=[0.0], env_mask=[0],
                         reward=None, task_id=task_id, rollout_key=rollout_key, exit_status=exit_status,
                         notes=[note] if note else [])


def ran_out_of_time(trajectory: Trajectory) -> bool:
    """The trial's deadline cut the agent off while its model calls were answering: the policy kept going.
    A call that failed (the model server) or no call at all (the sandbox, the harness) is infrastructure."""
    calls = trajectory.llm_calls
    return trajectory.exit_status == "timeout" and bool(calls) and all(call.error is None for call in calls)


def is_infrastructure_error(trajectory: Trajectory) -> bool:
    if ran_out_of_time(trajectory):
        return False
    return not is_agent_outcome(trajectory.exit_status) or trajectory.outcome is None \
        or trajectory.outcome.error is not None


def reward_of(trajectory: Trajectory) -> float | None:
    """The grader's reward as it gave it — a Claw task's continuous score (safety × (0.8 completion + 0.2
    robustness)), a claw-bench task's share of checks passed — not a 0/1 at the pass threshold; 1 or 0 by
    `resolved` only where the grader gives no reward. 0 for a policy the deadline stopped; None for an
    infrastructure error."""
    if ran_out_of_time(trajectory):
        return 0.0
    if is_infrastructure_error(trajectory):
        return None
    outcome = trajectory.outcome
    if outcome.reward is not None:
        return float(outcome.reward)
    return 1.0 if outcome.resolved else 0.0


def sample_from_calls(calls: list[LLMCall]) -> tuple[list[int], list[int], list[float], list[int], int, str | None]:
    """(prompt ids, completion ids, logprobs, env mask, calls used, drift) from a rollout's calls."""
    usable = [c for c in calls if c.error is None and c.completion_token_ids is not None]
    if not usable:
        raise NoTokenRecords("no model call of this rollout recorded token ids")
    first = usable[0]
    if first.prompt_token_ids is None:
        raise NoTokenRecords(f"call {first.id} has no prompt token ids")
    prompt = list(first.prompt_token_ids)
    sequence = list(prompt)
    completion: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    used, drift = 0, None
    for index, call in enumerate(usable):
        if index:
            ids = call.prompt_token_ids or []
            if ids[:len(sequence)] != sequence:
                position = next((i for i, (a, b) in enumerate(zip(ids, sequence)) if a != b),
                                min(len(ids), len(sequence)))
                drift = (f"call {index + 1} of {len(usable)}: its prompt departs from the ids recorded so far at "
                         f"token {position}; trained on the first {index} call(s)")
                break
            added = ids[len(sequence):]
            completion += added
            logprobs += [0.0] * len(added)
            mask += [0] * len(added)
            sequence += added
        sampled = list(call.completion_token_ids or [])
        reported = call.logprobs if call.logprobs is not None and len(call.logprobs) == len(sampled) else None
        completion += sampled
        logprobs += list(reported) if reported is not None else [0.0] * len(sampled)
        mask += [1] * len(sampled)
        sequence += sampled
        used += 1
    return prompt, completion, logprobs, mask, used, drift


def rollout_sample(trajectory: Trajectory, pad_id: int) -> RolloutSample:
    """The GRPO sample of a graded rollout (a placeholder for an infrastructure error, or for a rollout
    whose calls recorded no token ids)."""
    reward = reward_of(trajectory)
    key = dict(task_id=trajectory.task_id, rollout_key=trajectory.rollout_key, exit_status=trajectory.exit_status)
    if reward is None:
        error = trajectory.outcome.error if trajectory.outcome else None
        return placeholder(pad_id, **key, note=f"infrastructure error, masked: {error}")
    try:
        prompt, completion, logprobs, mask, used, drift = sample_from_calls(trajectory.llm_calls)
    except NoTokenRecords as exc:
        return placeholder(pad_id, **key, note=f"masked: {exc}")
    return RolloutSample(prompt_ids=prompt, completion_ids=completion, logprobs=logprobs, env_mask=mask,
                         reward=reward, calls=used, drift=drift,
                         resolved=trajectory.outcome.resolved if trajectory.outcome is not None else None, **key)
