"""Orchard's `GRPOTrainer`: TRL's, with what Orchard's rollouts need on top, each in its own mixin.

- `AllRolloutsBaseline` (orchard.recipes.rl_baseline): a trained rollout's advantage uses the mean and
  standard deviation of all its task's rollouts in the step, not only the balanced group's.

Importing this module imports TRL (and torch)."""

from __future__ import annotations

from trl import GRPOTrainer

from orchard.recipes.rl_baseline import AllRolloutsBaseline


class OrchardGRPOTrainer(AllRolloutsBaseline, GRPOTrainer):
    """`GRPOTrainer` for `orchard train rl` (see the module docstring)."""
