"""The advantage of a trained rollout comes from ALL of its task's rollouts in the step, not only from the
group that is trained.

BAR trains a balanced group (as many successes as failures) chosen from a task's rollouts. TRL's GRPO
normalizes each reward by its group's mean and standard deviation, so a balanced group always has mean 0.5:
a success on a task solved once in six rollouts would get the same advantage as one on a task solved half
the time — a biased estimate. As Reinforce-Ada's balanced variant does (Xiong et al., arXiv 2510.04996,
"global statistics": the group is down-sampled for training, the baseline uses every response drawn for the
prompt), the advantage of each trained rollout i of task x is

    A_i = (r_i - mean(R_x)) / (std(R_x) + eps)

where R_x is the reward of every graded rollout of x in this step (the unbiased standard deviation, as
TRL's `nanstd` and Reinforce-Ada's `torch.std`; eps = 1e-4 as TRL). Infrastructure-error rollouts have no
reward and are not in R_x. A rollout with no reward (a placeholder) gets advantage 0, as in TRL; so does a
task with fewer than two graded rollouts (no baseline). With `scale_rewards="none"` (Dr. GRPO) the
advantage is not divided by the standard deviation.

The rollout function passes (mean, std) per sample as extra fields (`baseline_mean`, `baseline_std`);
`AllRolloutsBaseline`, mixed into TRL's `GRPOTrainer` (orchard.recipes.rl.trainer), replaces TRL's group
advantages with these. For the fixed and DAPO strategies R_x is the group itself, so the advantages are
TRL's own (to float rounding)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EPS = 1e-4  # TRL's: advantages / (std + 1e-4)
MEAN_FIELD, STD_FIELD = "baseline_mean", "baseline_std"


@dataclass(frozen=True)
class TaskBaseline:
    """A task's reward statistics over every graded rollout of the step."""

    mean: float
    std: float
    rollouts: int


def task_baseline(rewards: Sequence[float]) -> TaskBaseline | None:
    """The baseline of a task whose graded rollouts got `rewards` (errors left out); None under two."""
    if len(rewards) < 2:
        return None
    return TaskBaseline(mean=statistics.fmean(rewards), std=statistics.stdev(rewards), rollouts=len(rewards))


def advantage(reward: float | None, mean: float | None, std: float | None, *, scale: bool = True) -> float:
    """(reward - mean) / (std + eps); 0 for a sample with no reward or a task with no baseline."""
    if reward is None or mean is None or std is None:
        return 0.0
    centered = reward - mean
    return centered / (std + EPS) if scale else centered


class AllRolloutsBaseline:
    """Mixed into `GRPOTrainer`: after TRL has scored a batch, each sample's advantage is recomputed from the
    baseline its rollout function passed (see the module docstring). A batch without those fields keeps
    TRL's advantages."""

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        if not inputs or MEAN_FIELD not in inputs[0]:
            return output
        import torch

        scale = getattr(self, "scale_rewards", "group") != "none"
        values = [advantage(row.get("rollout_reward"), row.get(MEAN_FIELD), row.get(STD_FIELD), scale=scale)
                  for row in inputs]
        current = output["advantages"]
        output["advantages"] = torch.tensor(values, dtype=current.dtype, device=current.device)
        logged = getattr(self, "_logs", {}).get("advantages")
        if logged is not None and self.accelerator.num_processes == 1:  # type: ignore[attr-defined]
            # TRL logged its group advantages; the completions table should show the ones trained
            for offset, value in enumerate(reversed(values), start=1):
                if offset <= len(logged):
                    logged[-offset] = value
        return output
