"""Token-weighted SFT on TRL: `WeightedSFTTrainer` (TRL's `SFTTrainer` whose loss scales each completion
token by its weight) and `run_sft`, the whole `orchard train sft` run.

The loss is TRL's (summed per-token negative log-likelihood over the trained tokens, divided by how many
tokens are trained in the whole accumulated batch), with each token's term multiplied by its weight. With
every weight 1.0 it is exactly TRL's loss; a token of weight 0.5 counts half, so weights keep their meaning
across a batch that mixes resolved rollouts (1.0) and credit-assigned steps of failed ones. It uses TRL's
fused LM head (per-token log-probabilities computed in tiles, no full logits), as TRL's own loss does."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from trl import SFTTrainer

from orchard.core.errors import InvalidRequest
from orchard.recipes.common.examples import IGNORE_INDEX, BuildReport, TrainingExample, build_examples
from orchard.recipes.sft.config import SFTSettings
from orchard.recipes.sft.inputs import read_training_trajectories
from orchard.recipes.sft.lr_schedule import scheduler
from orchard.recipes.sft.metrics import MetricsCallback, write_loss_plot, write_metrics

FINAL_MODEL_DIR = "model"
CHECKPOINT_PREFIX = "checkpoint-"
MISMATCHES_KEPT = 20  # in metrics.json; the count is always complete


@dataclass
class WeightedCollator:
    """Pads `input_ids` (pad token), `labels` (-100), `token_weights` (0.0) on the right and adds the
    attention mask."""

    pad_token_id: int

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in rows)

        def padded(column: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([list(row[column]) + [value] * (longest - len(row[column])) for row in rows],
                                dtype=dtype)

        batch = {"input_ids": padded("input_ids", self.pad_token_id, torch.long),
                 "labels": padded("labels", IGNORE_INDEX, torch.long),
                 "attention_mask": torch.tensor([[1] * len(row["input_ids"]) + [0] * (longest - len(row["input_ids"]))
                                                 for row in rows], dtype=torch.long)}
        if "token_weights" in rows[0]:
            batch["token_weights"] = padded("token_weights", 0.0, torch.float32)
        return batch


class WeightedSFTTrainer(SFTTrainer):
    """SFTTrainer with a per-token weighted loss; the batch carries `token_weights` (WeightedCollator).

    On GPUs the per-token log-probabilities come from TRL's fused LM head (tiles, no full logits). On a CPU
    that head scores every position, trained or not, and is several times slower than the model's own
    forward asked for the logits of the trained positions only (`logits_to_keep`), which is used there
    instead (`fused_on_cpu` = False); both give the same loss."""

    fused_on_cpu = False

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """transformers' schedule shapes with a warm-up that never runs a step at learning rate 0
        (lr_schedule.py)."""
        if self.lr_scheduler is None:
            shape = self.args.lr_scheduler_type  # transformers' SchedulerType enum, or its name
            self.lr_scheduler = scheduler(optimizer or self.optimizer, shape=getattr(shape, "value", shape),
                                          warmup=self.args.get_warmup_steps(num_training_steps),
                                          total=num_training_steps)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        weights = inputs.pop("token_weights")[:, 1:]
        labels = inputs.pop("labels")
        inputs["use_cache"] = False
        if labels.device.type == "cpu" and not self.fused_on_cpu:
            outputs, nll, mask, correct, weights = self._trained_positions_nll(model, inputs, labels, weights)
        else:
            outputs = model(**inputs, labels=labels, fused_lm_head=True)  # log-probs of the shifted labels
            nll, mask, correct = -outputs.log_probs, outputs.label_mask, outputs.is_top1
        count = mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = (nll * weights.to(nll.dtype)).sum() / torch.as_tensor(count).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())  # as TRL: DDP averages
        self._log_metrics(model, inputs, mask, correct)
        return (loss, outputs) if return_outputs else loss

    @staticmethod
    def _trained_positions_nll(model, inputs, labels, weights):
        target = labels[:, 1:]  # position p predicts token p + 1
        keep = (target != IGNORE_INDEX).any(dim=0).nonzero().squeeze(-1)
        if keep.numel() == 0:  # nothing trained: one masked position keeps the loss connected to the model
            keep = torch.zeros(1, dtype=torch.long, device=labels.device)
        outputs = model(**inputs, logits_to_keep=keep)
        logits, kept = outputs.logits, target[:, keep]
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), kept.flatten(),
                                                ignore_index=IGNORE_INDEX, reduction="none").view_as(kept)
        mask = kept != IGNORE_INDEX
        return outputs, nll, mask, (logits.argmax(dim=-1) == kept) & mask, weights[:, keep]

    def _log_metrics(self, model, inputs, mask, correct) -> None:
        mode = "train" if model.training else "eval"
        valid = self.accelerator.gather_for_metrics(mask.sum()).sum()
        right = self.accelerator.gather_for_metrics(correct.sum()).sum()
        self._metrics[mode]["mean_token_accuracy"].append((right / valid).item() if valid > 0 else 0.0)
        if mode == "train":
            self._total_train_tokens += self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]


def examples_dataset(examples: Sequence[TrainingExample]) -> Any:
    import datasets

    return datasets.Dataset.from_list([example.row() for example in examples])


def check_model_dir(path: Path | None) -> Path:
    if path is None:
        raise InvalidRequest("no model given; pass --model with a local Hugging Face model directory (for the "
                             "embedded SmolLM2, make one with `orchard train export-smollm2 DIR`)")
    if not path.is_dir():
        raise InvalidRequest(f"the model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise InvalidRequest(f"{path} is not a Hugging Face model directory (it has no config.json); pass a "
                             "directory saved with save_pretrained, or make one with `orchard train export-smollm2`")
    return path


def load_tokenizer(model_dir: Path) -> Any:
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot load a tokenizer from {model_dir}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(f"the tokenizer in {model_dir} has no chat template; the examples are rendered with "
                             "the student's chat template")
    return tokenizer


def last_checkpoint(out: Path) -> Path | None:
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(out)) if out.is_dir() else None
    return Path(found) if found else None


@dataclass
class SFTResult:
    out: Path
    model_dir: Path
    report: BuildReport
    resumed_from: Path | None
    totals: dict[str, Any] = field(default_factory=dict)


def run_sft(settings: SFTSettings, *, resume: bool = False, callbacks: Sequence[Any] = (),
            report: BuildReport | None = None, disable_tqdm: bool = False) -> SFTResult:
    """Build the examples from `settings.inputs`, train `settings.model` on them, write checkpoints,
    metrics and the final model (OUT/model) under `settings.out`. `resume` continues from OUT's last
    checkpoint; without it an OUT that has checkpoints is refused rather than overwritten. `report`: examples
    already built (e.g. by a recipe that weights them); then `settings.inputs` is not read."""
    model_dir = check_model_dir(settings.model)
    if settings.out is None:
        raise InvalidRequest("no output directory given; pass --out DIR")
    out = settings.out
    checkpoint = last_checkpoint(out)
    if resume and checkpoint is None:
        raise InvalidRequest(f"nothing to resume: {out} has no {CHECKPOINT_PREFIX}N directory")
    if not resume and checkpoint is not None:
        raise InvalidRequest(f"{out} already holds checkpoints of a run; pass --resume to continue it or choose "
                             "another --out")
    tokenizer = load_tokenizer(model_dir)
    if report is None:
        report = build_examples(read_training_trajectories(settings.inputs), tokenizer, filters=settings.filters)
    if not report.examples:
        raise InvalidRequest(f"no training examples: {report.summary()}; check the inputs and the filters")

    import transformers

    args = settings.trl_config(out, disable_tqdm=disable_tqdm)  # refuses impossible settings before any work
    out.mkdir(parents=True, exist_ok=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True)
    run = {"model": str(model_dir), "inputs": [str(path) for path in settings.inputs],
           "settings": settings.model_dump(mode="json"), "data": data_summary(report)}
    title = f"SFT of {model_dir.name}: {len(report.examples)} examples, {report.trained_tokens} trained tokens"
    trainer = WeightedSFTTrainer(
        model=model, args=args,
        train_dataset=examples_dataset(report.examples), processing_class=tokenizer,
        data_collator=WeightedCollator(pad_token_id=pad_token_id(tokenizer)),
        callbacks=[MetricsCallback(out, run, title), *callbacks])
    if disable_tqdm:  # the caller shows progress: no log lines printed in its place
        trainer.remove_callback(transformers.PrinterCallback)
    earlier_tokens = tokens_logged(checkpoint) if resume else 0
    trainer._total_train_tokens = earlier_tokens  # TRL counts from 0 in each process: carry the count on
    output = trainer.train(resume_from_checkpoint=str(checkpoint) if resume else None)
    session_tokens = trainer._total_train_tokens - earlier_tokens
    totals = {**output.metrics, "global_step": trainer.state.global_step, "tokens": trainer._total_train_tokens,
              "tokens_per_second": session_tokens / max(output.metrics.get("train_runtime", 0), 1e-9)}
    final = out / FINAL_MODEL_DIR
    staging = out / f".{FINAL_MODEL_DIR}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))  # the model and its tokenizer (the processing class)
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    write_metrics(out, run, trainer.state.log_history, totals=totals)
    write_loss_plot(out, trainer.state.log_history, title)
    return SFTResult(out=out, model_dir=final, report=report, resumed_from=checkpoint if resume else None,
                     totals=totals)


def data_summary(report: BuildReport) -> dict[str, Any]:
    return {"trajectories": report.trajectories, "calls": report.calls, "examples": len(report.examples),
            "trained_tokens": report.trained_tokens,
            "tokens": sum(len(example.input_ids) for example in report.examples),
            "skipped": report.skipped, "kept": report.kept, "mismatches": len(report.mismatches),
            "mismatch_examples": [m.model_dump(mode="json") for m in report.mismatches[:MISMATCHES_KEPT]]}


def tokens_logged(checkpoint: Path) -> int:
    from transformers import TrainerState

    history = TrainerState.load_from_json(str(checkpoint / "trainer_state.json")).log_history
    return int(next((entry["num_tokens"] for entry in reversed(history) if "num_tokens" in entry), 0))


def pad_token_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise InvalidRequest("the tokenizer has neither a pad nor an end-of-sequence token to pad batches with")
    return int(pad)
