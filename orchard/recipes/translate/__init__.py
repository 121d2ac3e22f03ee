"""Cross-harness distillation: a trajectory recorded in one harness as another would have recorded it
(`trajectory.py`), checked by replaying it with the target's tools (`replay.py`) or by running the target
harness itself (`harness_replay.py`)."""
