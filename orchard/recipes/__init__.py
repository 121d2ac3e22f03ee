"""Training recipes on TRL: trajectories -> training data, weighted SFT, credit assignment, BAR + GRPO. One
package per recipe (`sft`, `rl`, `bar`, `translate`, `credit`); `common` holds what several of them use."""
