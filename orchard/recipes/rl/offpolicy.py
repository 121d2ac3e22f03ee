"""Samples the trainer did not sample itself: the importance-sampling correction against the sampler, and
policy shaping for guided (off-policy) rollouts.

**Truncated importance sampling (TIS).** A rollout is sampled by the gateway's policy (in-process
generation, a vLLM server, a server whose weights lag the trainer's under `--no-vllm-sync`), and each of its
tokens carries the logprob the sampler reported (`rollout_func`'s `logprobs`, TRL's
`sampling_per_token_logps`). TRL corrects for a sampler that is not the trainer only on its own vLLM path
(`use_vllm` + `vllm_importance_sampling_correction`); here the same correction is applied to `rollout_func`
samples, with TRL's own settings (`vllm_importance_sampling_mode`, `..._clip_min`, `..._clip_max`): per
trained token (env_mask 1)

    w_t = min(pi_old(a_t) / pi_sampler(a_t), C)        (token_truncate; C = vllm_importance_sampling_clip_max)

where pi_old is the trainer's policy when the batch was generated (computed once per batch, as TRL does
with vLLM). The policy term of each token's loss is multiplied by w_t; environment tokens and padding get 1.

**Policy shaping (LUFFY).** A guided rollout (`--guide oracle`: the oracle's replies, scored by the policy)
was not sampled from any policy the trainer can name: the guide is deterministic (pi_guide = 1). As in
LUFFY (Yan et al., "Learning to Reason under Off-Policy Guidance", arXiv 2504.14945), it takes part in its
group's advantage like any rollout, and its tokens' loss is

    l_t = -f(pi_theta(a_t)) * A,    f(p) = p / (p + gamma)       (gamma = 0.1)

with no clipping and no importance weight: the gradient, A * gamma / (p + gamma)^2 * grad p, is largest for
the tokens the policy finds unlikely, which plain pi_theta/pi_guide = pi_theta would all but ignore.
Sampled rollouts of the same batch keep TRL's clipped objective with the TIS weight above.

`SamplerCorrection` is mixed into TRL's `GRPOTrainer` (orchard.recipes.rl.trainer). The rollout function
marks guided samples with the extra field `guided` (True / False per sample)."""

from __future__ import annotations

import math
from typing import Any

GUIDED_FIELD = "guided"
SHAPING_GAMMA = 0.1  # LUFFY's gamma
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL's
MIXED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")  # the clipped objectives a guided batch supports


def sampler_ratio(old: Any, sampling: Any, mask: Any, *, mode: str, clip_min: float | None,
                  clip_max: float | None) -> Any:
    """TRL's importance-sampling ratio pi_old / pi_sampler for its `vllm_importance_sampling_mode`, on the
    tokens of `mask` (1 elsewhere): (B, T) for token modes, (B, 1) for sequence modes. A token whose sampler
    logprob is NaN counts as a ratio of 1."""
    import torch

    if mode not in IS_MODES:
        raise ValueError(f"importance sampling mode {mode!r}: choose from {', '.join(IS_MODES)}")
    difference = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(dim=-1, keepdim=True)
    ratio = torch.exp(difference)
    if mode.endswith("truncate"):
        if clip_min is not None or clip_max is not None:
            ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
        return ratio
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def shaped_token_loss(per_token_logps: Any, advantages: Any, gamma: float = SHAPING_GAMMA) -> Any:
    """LUFFY's off-policy token loss -f(pi) * A with f(p) = p / (p + gamma); no clipping."""
    import torch

    probability = torch.exp(per_token_logps)
    return -(probability / (probability + gamma)) * advantages


class SamplerCorrection:
    """Mixed into `GRPOTrainer` (see the module docstring). `policy_shaping_gamma`: LUFFY's gamma."""

    def __init__(self, *args: Any, policy_shaping_gamma: float = SHAPING_GAMMA, **kwargs: Any) -> None:
        if not policy_shaping_gamma > 0:
            raise ValueError(f"policy_shaping_gamma must be > 0 (LUFFY: 0.1), got {policy_shaping_gamma}")
        self.policy_shaping_gamma = policy_shaping_gamma
        super().__init__(*args, **kwargs)
        if self.corrects_sampler and self.vllm_importance_sampling_mode not in IS_MODES:
            raise ValueError(f"vllm_importance_sampling_mode {self.vllm_importance_sampling_mode!r}: choose from "
                             f"{', '.join(IS_MODES)}")

    @property
    def corrects_sampler(self) -> bool:
        """This mixin applies the IS correction (TRL does it itself with `use_vllm`)."""
        return bool(self.vllm_importance_sampling_correction) and not self.use_vllm

    # --- scoring a batch: the IS ratio against the sampler, the guided rows ----------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        output = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        device = output["completion_ids"].device
        # TRL copied the rollout function's extra fields into the input rows
        guided = torch.tensor([bool(row.get(GUIDED_FIELD)) for row in inputs], dtype=torch.bool, device=device)
        output[GUIDED_FIELD] = guided
        sampling = output.get("sampling_per_token_logps")
        if not self.corrects_sampler or sampling is None:
            return output
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        old = output.get("old_per_token_logps")
        if old is None:
            old = output["old_per_token_logps"] = self._policy_logps(output)
        ratio = sampler_ratio(old, sampling, mask, mode=self.vllm_importance_sampling_mode,
                              clip_min=self.vllm_importance_sampling_clip_min,
                              clip_max=self.vllm_importance_sampling_clip_max)
        ratio = torch.where(guided.unsqueeze(1), torch.ones_like(ratio), ratio)  # guided rows: shaping instead
        output["importance_sampling_ratio"] = ratio
        self._log_sampler_metrics(old, sampling, ratio, mask * (~guided).unsqueeze(1))
        return output

    def _policy_logps(self, output: dict[str, Any]) -> Any:
        """pi_old: the trainer's per-token logprobs of the batch, with the weights that are about to train."""
        import torch
        from trl.models.utils import disable_gradient_checkpointing

        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        mode = "train" if self.model.training else "eval"
        batch_size = (self.args.per_device_train_batch_size if mode == "train"
                      else self.args.per_device_eval_batch_size)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, output["completion_ids"].size(1), batch_size=batch_size)
        return logps

    def _log_sampler_metrics(self, old: Any, sampling: Any, ratio: Any, mask: Any) -> None:
        """TRL's metric names for its vLLM correction, over the sampled rows' trained tokens."""
        import torch

        mode = "train" if self.model.training else "eval"
        trained = mask.bool()
        delta = torch.abs(old - sampling)[trained & ~torch.isnan(sampling)]
        ratios = ratio.expand_as(mask)[trained]
        metrics = self._metrics[mode]
        if delta.numel():
            metrics["sampling/sampling_logp_difference/mean"].append(delta.mean().item())
            metrics["sampling/sampling_logp_difference/max"].append(delta.max().item())
        if ratios.numel():
            metrics["sampling/importance_sampling_ratio/min"].append(ratios.min().item())
            metrics["sampling/importance_sampling_ratio/mean"].append(ratios.mean().item())
            metrics["sampling/importance_sampling_ratio/max"].append(ratios.max().item())

    # --- the loss ------------------------------------------------------------------------------------------

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        ratio = inputs.get("importance_sampling_ratio")
        if ratio is not None and self.corrects_sampler and self.loss_type != "vespo":
            # every policy term TRL computes is A times something (the clipped min with w >= 0 included), so
            # weighting A by w_t is TRL's own `per_token_loss * importance_sampling_ratio`; VESPO reads the
            # ratio from the inputs itself
            advantages = inputs["advantages"]
            advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
            inputs = {**inputs, "advantages": advantages * ratio}
        guided = inputs.get(GUIDED_FIELD)
        if guided is None or not bool(guided.any()):
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        return self._mixed_policy_loss(model, inputs, guided)

    def _mixed_policy_loss(self, model: Any, inputs: dict[str, Any], guided: Any) -> Any:
        """TRL's clipped GRPO loss for the sampled rows, LUFFY's shaped loss for the guided rows, aggregated
        over the batch as TRL aggregates `loss_type`."""
        import torch

        self._check_mixed_supported()
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_entropy=True)
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        coef_1 = torch.exp(per_token_logps - old)
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
        if self.args.delta is not None:
            coef_1 = torch.clamp(coef_1, max=self.args.delta)
        clipped = -torch.min(coef_1 * advantages, coef_2 * advantages)
        shaped = shaped_token_loss(per_token_logps, advantages, self.policy_shaping_gamma)
        rows = guided.unsqueeze(1)
        per_token_loss = torch.where(rows, shaped, clipped)
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * torch.where(rows, torch.ones_like(coef_1), coef_1)
            per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = self._aggregate(per_token_loss, mask, inputs)

        mode = "train" if self.model.training else "eval"
        count = mask.sum().clamp(min=1.0)
        sampled = mask * (~rows)
        region_clipped = (((coef_1 < 1 - self.epsilon_low) & (advantages < 0))
                          | ((coef_1 > 1 + self.epsilon_high) & (advantages > 0))).float()
        self._metrics[mode]["entropy"].append(((entropies * mask).sum() / count).item())
        self._metrics[mode]["clip_ratio/region_mean"].append(
            ((region_clipped * sampled).sum() / sampled.sum().clamp(min=1.0)).item())
        self._metrics[mode]["offpolicy/guided_token_fraction"].append(((mask * rows).sum() / count).item())
        return loss

    def _aggregate(self, per_token_loss: Any, mask: Any, inputs: dict[str, Any]) -> Any:
        """TRL's reduction of per-token losses for `loss_type` (grpo, bnpo, dr_grpo, dapo)."""
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        masked = per_token_loss * mask
        if self.loss_type == "grpo":
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
        if self.loss_type == "bnpo":
            return masked.sum() / mask.sum().clamp(min=1.0) / accumulation
        if self.loss_type == "dr_grpo":
            return masked.sum() / (per_token_loss.size(0) * self.max_completion_length) / accumulation
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes  # dapo
        if mode == "train":
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return masked.sum() / normalizer

    def _check_mixed_supported(self) -> None:
        unsupported = []
        if self.loss_type not in MIXED_LOSS_TYPES:
            unsupported.append(f"loss_type={self.loss_type!r} (use one of {', '.join(MIXED_LOSS_TYPES)})")
        if self.importance_sampling_level != "token":
            unsupported.append(f"importance_sampling_level={self.importance_sampling_level!r}")
        if self.top_entropy_quantile < 1.0:
            unsupported.append(f"top_entropy_quantile={self.top_entropy_quantile}")
        if self.off_policy_mask_threshold is not None:
            unsupported.append(f"off_policy_mask_threshold={self.off_policy_mask_threshold}")
        if self._entropy_bonus_enabled:
            unsupported.append("an entropy bonus (entropy_coef)")
        if self.aux_loss_enabled:
            unsupported.append("a router aux loss")
        if unsupported:
            raise ValueError("a batch with guided (off-policy) samples is trained with LUFFY's shaped loss, which "
                             f"supports none of: {'; '.join(unsupported)}; change these GRPOConfig settings or "
                             "train without --guide")
