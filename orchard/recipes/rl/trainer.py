"""Orchard's `GRPOTrainer`: TRL's, with what Orchard's rollouts need on top, each in its own mixin.

- `AllRolloutsBaseline` (orchard.recipes.rl.baseline): a trained rollout's advantage uses the mean and
  standard deviation of all its task's rollouts in the step, not only the balanced group's.
- `SamplerCorrection` (orchard.recipes.rl.offpolicy): truncated importance sampling against the sampler's
  recorded logprobs, and LUFFY's policy shaping for guided (off-policy) samples.

Importing this module imports TRL (and torch)."""

from __future__ import annotations

from trl import GRPOTrainer

from orchard.recipes.rl.baseline import AllRolloutsBaseline
from orchard.recipes.rl.offpolicy import SamplerCorrection


class OrchardGRPOTrainer(SamplerCorrection, AllRolloutsBaseline, GRPOTrainer):
    """`GRPOTrainer` for `orchard train rl` (see the module docstring)."""
