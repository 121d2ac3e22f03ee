"""Token-weighted SFT on recorded model calls (`orchard train sft`): the run on TRL's SFTTrainer (`train.py`),
its settings (`config.py`, `agent.yaml` for agent SFT on a GPU), its metrics files (`metrics.py`), the
learning-rate schedule (`lr_schedule.py`) and the trajectories it reads (`inputs.py`)."""
