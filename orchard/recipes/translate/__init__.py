"""Cross-harness distillation: a trajectory recorded in one harness as another would have recorded it
(`trajectory.py`), checked by replaying it with the target's tools (`replay.py`) or by running the target
harness itself (`harness_replay.py`); the prompts of a harness that renders its own are captured first
(`captured.py`). What each harness says and how is not here: every harness declares its own dialect
(orchard/core/dialect.py), so any registered harness with one, a plug-in's too, takes part."""
