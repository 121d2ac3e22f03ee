"""The learning-rate schedule of Orchard's trainers: transformers' shapes (linear, cosine, constant, constant
with warm-up) with a warm-up whose every step trains.

transformers' warm-up gives step 0 the factor 0 / warmup: with any warm-up the first optimizer step runs at
learning rate 0 and changes no weight (a 2-step run with warm-up 0.03 rounds up to one warm-up step and
trained once, not twice). Here warm-up step s of w has the factor (s + 1) / (w + 1), and the decay after
it never reaches 0 inside the run (cosine and linear end one step short of their zero), so every step of a
run moves the weights."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

SHAPES = ("linear", "cosine", "constant", "constant_with_warmup")


def factor(step: int, *, shape: str, warmup: int, total: int) -> float:
    """The multiplier of the base learning rate at optimizer step `step` (0-based) of `total`."""
    if shape not in SHAPES:
        raise ValueError(f"unknown learning-rate schedule {shape!r}; choose one of {', '.join(SHAPES)}")
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if shape.startswith("constant"):
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)  # < 1 for every step of the run
    if shape == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def scheduler(optimizer: Optimizer, *, shape: str, warmup: int, total: int) -> LambdaLR:
    if shape not in SHAPES:  # refused before the first step, not at it
        raise ValueError(f"unknown learning-rate schedule {shape!r}; choose one of {', '.join(SHAPES)}")
    return LambdaLR(optimizer, lambda step: factor(step, shape=shape, warmup=warmup, total=total))
