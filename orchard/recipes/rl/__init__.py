"""GRPO on TRL with real rollouts (`orchard train rl`): the run (`train.py`), the trainer with Orchard's mixins
(`trainer.py`), TRL's rollout function with BAR per group (`rollout_func.py`), the rollouts' environment
(`env.py`), the policy served through the run's gateway (`policy.py`, `vllm.py`, `vllm_sync.py`), graded
rollouts as samples (`samples.py`), the task pool (`task_pool.py`), the advantage baseline (`baseline.py`),
off-policy corrections (`offpolicy.py`) and guided rollouts (`guide.py`)."""
