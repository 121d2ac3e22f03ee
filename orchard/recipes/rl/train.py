"""`orchard train rl`: GRPO (TRL `GRPOTrainer`) with rollouts that are real trials — a harness on real tasks
in Orchard sandboxes, graded by the task's grader — and BAR deciding how many rollouts each task gets.

    result = train_rl(RLConfig(model="runs/smollm2-sft", suite="swe-mini", tasks=[...], max_steps=1))

The policy being trained answers the harness through the run's gateway (`TrainingPolicy`, in-process
transformers generation on CPU); the trainer reads the gateway's records — the ids the policy sampled, its
logprobs, the environment's tokens between turns (`env_mask` 0) — and the grader's reward.

On a GPU, generation belongs in vLLM: start vLLM's OpenAI server on the model directory and set
`RLConfig.vllm_url` / `vllm_model` (`VLLMPolicy`, orchard.recipes.rl.vllm): prompts go to its completions
endpoint as token ids, so the trainer gets exactly the ids vLLM sampled. `policy_route` instead routes the
`policy` alias to any chat server (text in: its prompts are re-rendered each call, drift is reported)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.core.errors import InvalidRequest
from orchard.core.harness import SamplingParams
from orchard.eval.run_config import TrialTimeouts
from orchard.eval.suites import load_suite, select_tasks
from orchard.gateway.config import ModelRoute
from orchard.recipes.bar.config import BarConfig, Strategy
from orchard.recipes.rl.env import RolloutEnv
from orchard.recipes.rl.policy import Forced, TrainingPolicy
from orchard.recipes.rl.rollout_func import BarRolloutFunc, StepReport, orchard_reward

log = logging.getLogger(__name__)

TINY_MODEL = "tiny-qwen3"  # a random-init tiny Qwen3 with SmolLM2's tokenizer (tests, smoke runs)


class RLConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(default=TINY_MODEL, description=f"a model directory (transformers), or {TINY_MODEL!r}")
    out: Path = Field(default=Path("runs/rl"), description="checkpoint, metrics.json")
    suite: str = "swe-mini"
    tasks: list[str] | None = Field(default=None, description="task ids (default: the whole suite)")
    harness: str = "react"
    harness_options: dict[str, Any] = Field(default_factory=lambda: {"step_limit": 4})
    num_generations: int = Field(default=4, ge=2, description="G: rollouts per task in a training group")
    tasks_per_step: int = Field(default=1, ge=1, description="tasks (groups) per training step")
    max_steps: int = Field(default=1, ge=1)
    learning_rate: float = Field(default=1e-5, gt=0)
    temperature: float = Field(default=1.0, gt=0)
    max_tokens: int = Field(default=128, ge=1, description="per model call")
    strategy: Strategy = "bar"
    bar: BarConfig = Field(default_factory=BarConfig)
    parallel: int = Field(default=1, ge=1, description="rollouts (sandboxes) at once")
    agent_timeout_s: float = Field(default=600, gt=0)
    seed: int = 0
    guide: Literal["oracle"] | None = Field(
        default=None, description="oracle: every `guide_every`-th rollout of a task plays the oracle's replies, "
                                  "scored by the policy (orchard.recipes.rl.guide), so a group can hold a success")
    guide_every: int = Field(default=2, ge=1)
    guide_gamma: float = Field(default=0.1, gt=0, description="guided tokens' loss is -A * p/(p + gamma), LUFFY's "
                                                              "policy shaping (orchard.recipes.rl.offpolicy)")
    importance_sampling: bool = Field(
        default=True, description="weight each sampled token by min(pi_trainer/pi_sampler, "
                                  "importance_sampling_cap), pi_sampler from the logprobs the gateway recorded "
                                  "(truncated IS; off at a temperature other than 1, where the recorded logprobs "
                                  "are not the tempered sampler's)")
    importance_sampling_cap: float = Field(default=3.0, gt=0, description="C of truncated IS (TRL's default)")
    policy_route: ModelRoute | None = Field(
        default=None, description="serve the policy from this gateway route (e.g. a vLLM server) instead of "
                                  "in-process generation (chat text in; prefer vllm_url for a vLLM server)")
    vllm_url: str | None = Field(
        default=None, description="a vLLM OpenAI server (e.g. http://127.0.0.1:8000/v1) that samples the policy "
                                  "from token ids (its /completions endpoint); `model` is its model directory, "
                                  "for the tokenizer")
    vllm_model: str | None = Field(default=None, description="the model name the vLLM server serves "
                                                             "(default: `model`)")
    vllm_sync: bool = Field(default=True, description="before each step's rollouts, save the trainer's weights "
                                                      "under OUT/vllm-weights and have the vLLM server reload "
                                                      "them (it must run with VLLM_SERVER_DEV_MODE=1)")


class RLResult(BaseModel):
    out: Path
    steps: int
    losses: list[float]
    weights_changed: bool
    reports: list[dict[str, Any]]
    train_s: float
    rollout_s: float


def load_policy_model(name: str, *, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): the tiny random Qwen3, or a transformers model directory (offline)."""
    from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3

    if name == TINY_MODEL:
        tokenizer = smollm2_tokenizer()
        return tiny_qwen3(tokenizer, seed=seed), tokenizer
    import transformers

    path = Path(name)
    if not (path / "config.json").is_file():
        raise InvalidRequest(f"--model {name}: not a model directory (no config.json) and not {TINY_MODEL!r}; "
                             "give a directory saved by transformers (e.g. `orchard train sft`'s output)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype="float32")
    return model, tokenizer


def positives_at(bar: BarConfig, pass_threshold: float) -> BarConfig:
    """BAR's settings with a positive rollout being a resolved one, at the suite's pass threshold (Claw's 0.75:
    a partial score of 0.6 is not a success there), unless the config names `positive_threshold` itself.
    On a suite of 0/1 rewards (threshold 1) this is what the default 0.5 already did."""
    if "positive_threshold" in bar.model_fields_set:
        return bar
    return bar.model_copy(update={"positive_threshold": pass_threshold})


def _marking_guided(guide: Any, on_step: Callable[[StepReport], None] | None) -> Callable[[StepReport], None]:
    """Each rollout of the step's report says whether the guide played it (`behaviour`)."""
    def marked(report: StepReport) -> None:
        for rollout in report.rollout_log:
            rollout["behaviour"] = guide.role(rollout["rollout_key"])
        if on_step is not None:
            on_step(report)
    return marked


def train_rl(config: RLConfig, *, forced: Forced | None = None, on_step: Callable[[StepReport], None] | None = None,
             model_and_tokenizer: tuple[Any, Any] | None = None) -> RLResult:
    """Train; returns the losses and each step's rollout report (also written to OUT/metrics.json)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from orchard.recipes.rl.trainer import OrchardGRPOTrainer

    suite = load_suite(config.suite)
    tasks = {task.id: task for task in select_tasks(suite, config.tasks)}
    model, tokenizer = model_and_tokenizer or load_policy_model(config.model, seed=config.seed)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    before = [p.detach().clone() for p in model.parameters()]
    guide = None
    if config.guide is not None and forced is None:
        if config.policy_route is not None:
            raise InvalidRequest("--guide needs the in-process policy or a vLLM server (--vllm-url): it dictates "
                                 "the policy's replies and has them scored; a chat route cannot score them")
        from orchard.recipes.rl.guide import GUIDED, OracleGuide

        forced = guide = OracleGuide(tasks.values(), every=config.guide_every)
        on_step = _marking_guided(guide, on_step)
    if config.vllm_url is not None:
        from orchard.recipes.rl.vllm import VLLMPolicy

        from orchard.recipes.rl.vllm_sync import ReloadWeights

        sync = ReloadWeights(config.vllm_url, config.out / "vllm-weights") if config.vllm_sync else None
        policy = VLLMPolicy(tokenizer=tokenizer, url=config.vllm_url, served_model=config.vllm_model or config.model,
                            sync=sync, forced=forced)
    else:
        policy = TrainingPolicy(model, tokenizer, forced=forced) if config.policy_route is None else None
    sampling = SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens, seed=None)
    batch = config.tasks_per_step * config.num_generations
    correct = config.importance_sampling and config.temperature == 1.0
    if config.importance_sampling and not correct:
        log.warning("importance sampling is off: the gateway records untempered logprobs, so at temperature %g "
                    "the ratio would measure the temperature, not the sampler's lag", config.temperature)
    args = GRPOConfig(
        output_dir=str(config.out), per_device_train_batch_size=batch, gradient_accumulation_steps=1,
        num_generations=config.num_generations, max_steps=config.max_steps, learning_rate=config.learning_rate,
        temperature=config.temperature, beta=0.0, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=not torch.cuda.is_available(), seed=config.seed, max_completion_length=1 << 16,
        disable_tqdm=True, vllm_importance_sampling_correction=correct,  # applied by OrchardGRPOTrainer
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=config.importance_sampling_cap)
    dataset = Dataset.from_list([{"prompt": task_id} for task_id in tasks])
    bar = positives_at(config.bar, suite.pass_threshold)
    try:
        with RolloutEnv(policy, harness=config.harness, harness_options=config.harness_options, sampling=sampling,
                        parallel=config.parallel, route=config.policy_route, pass_threshold=suite.pass_threshold,
                        timeouts=TrialTimeouts(agent_s=config.agent_timeout_s,
                                               trial_s=config.agent_timeout_s + 1200)) as env:
            rollout_func = BarRolloutFunc(env=env, tasks=tasks, pad_id=tokenizer.pad_token_id,
                                          strategy=config.strategy, bar=bar, on_step=on_step,
                                          guided=(lambda key: guide.role(key) == GUIDED) if guide else None)
            trainer = OrchardGRPOTrainer(model=model, reward_funcs=[orchard_reward], args=args, train_dataset=dataset,
                                         processing_class=tokenizer, rollout_func=rollout_func,
                                         policy_shaping_gamma=config.guide_gamma)
            started = time.monotonic()
            trainer.train()
            elapsed = time.monotonic() - started  # rollouts included: they run inside the training step
    finally:
        if hasattr(policy, "close"):
            policy.close()  # a VLLMPolicy's HTTP client
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    config.out.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(config.out / "final"))
    rollout_s = sum(r.rollout_s for r in rollout_func.reports)
    result = RLResult(out=config.out, steps=trainer.state.global_step, losses=losses, weights_changed=changed,
                      reports=[vars(r) for r in rollout_func.reports], train_s=elapsed - rollout_s,
                      rollout_s=rollout_s)
    (config.out / "metrics.json").write_text(json.dumps(json.loads(result.model_dump_json()), indent=2) + "\n")
    return result
