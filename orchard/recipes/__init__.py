"""Training recipes on TRL: trajectories -> training data, weighted SFT, credit assignment, BAR + GRPO."""
