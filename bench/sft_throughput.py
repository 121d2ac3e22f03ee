"""Measurement: SFT throughput (tokens/s) of Orchard's token-weighted trainer beside plain TRL `SFTTrainer`
(the floor) on the same examples, model, settings and thread count.

Data: react + oracle rollouts of swe-mini tasks, made into examples for SmolLM2's tokenizer (each call's
prompt masked, its completion trained). Model: a random Qwen3 with SmolLM2's vocabulary, small enough for
CPU steps in seconds. Three trainers, in alternating rounds so that load on the machine hits each alike:
plain TRL (its own loss, TRL's fused LM head), Orchard's weighted trainer as it runs on this device, and
the weighted trainer forced onto TRL's fused head (the cost of weighting alone, same kernel as the floor)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import embedded_async_orchard
from bench.results_model import Findings, Row, Target, ratio
from orchard.eval.models import eval_gateway_config
from orchard.eval.results import read_trajectories
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite

TARGET = 0.9  # weighted tokens/s ≥ 0.9 × plain TRL
HIDDEN, LAYERS, THREADS = 128, 4, 1


def oracle_examples(tasks: int) -> list[Any]:
    from orchard.recipes.common.examples import build_examples
    from orchard.recipes.common.tiny_models import smollm2_tokenizer

    task_ids = [task.id for task in load_suite("swe-mini").tasks[:tasks]]

    async def rollouts(out: str) -> None:
        async with embedded_async_orchard() as orchard:
            await run_eval(harness="react", model="oracle", suite="swe-mini", out_dir=out, task_ids=task_ids,
                           gateway_config=eval_gateway_config("oracle"), parallel=2, orchard_client=orchard)

    with tempfile.TemporaryDirectory(prefix="orchard-bench-sft-") as out:
        asyncio.run(rollouts(out))
        report = build_examples(read_trajectories(Path(out)), smollm2_tokenizer())
    if not report.examples:
        raise RuntimeError(f"the oracle rollouts gave no examples: {report.summary()}")
    return report.examples


def tokens_per_second(kind: str, examples: list[Any], steps: int) -> float:
    """One training run of `steps` optimizer steps from a fresh model; trained-on tokens (prompt + completion,
    padding excluded) per second of the training loop."""
    import torch
    from transformers import PrinterCallback
    from trl import SFTTrainer

    from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3
    from orchard.recipes.sft.config import SFTSettings
    from orchard.recipes.sft.train import WeightedCollator, WeightedSFTTrainer, examples_dataset

    tokenizer = smollm2_tokenizer()
    model = tiny_qwen3(tokenizer, hidden_size=HIDDEN, layers=LAYERS)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-sft-run-") as out:
        args = SFTSettings(max_steps=steps, gradient_accumulation_steps=1, save_steps=10_000, logging_steps=steps,
                           warmup_steps=0).trl_config(Path(out), disable_tqdm=True, save_strategy="no")
        dataset = examples_dataset(examples)
        if kind == "plain":
            trainer = SFTTrainer(model=model, args=args, train_dataset=dataset.remove_columns("token_weights"),
                                 processing_class=tokenizer)
        else:
            trainer = WeightedSFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                         data_collator=WeightedCollator(tokenizer.eos_token_id))
            trainer.fused_on_cpu = kind == "fused"
        trainer.remove_callback(PrinterCallback)  # no log lines in the bench's output
        before = torch.get_num_threads()
        torch.set_num_threads(THREADS)
        try:
            started = time.perf_counter()
            trainer.train()
            elapsed = time.perf_counter() - started
        finally:
            torch.set_num_threads(before)
        return trainer._total_train_tokens / elapsed


def run(ctx: BenchContext) -> Findings:
    rounds, steps = ctx.pick(3, 1), ctx.pick(6, 3)
    with ctx.console.status("react + oracle rollouts on swe-mini"):
        examples = oracle_examples(ctx.pick(6, 2))
    kinds = ("plain", "weighted", "fused")
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    with ctx.console.status(f"{rounds} round(s) of {steps} steps per trainer"):
        tokens_per_second("weighted", examples, 1)  # warm-up: first imports and allocations, not counted
        for round_index in range(rounds):
            for kind in kinds[round_index % 3:] + kinds[:round_index % 3]:  # rotate who goes first
                rates[kind].append(tokens_per_second(kind, examples, steps))
    best = {kind: max(values) for kind, values in rates.items()}  # the least disturbed round of each
    lengths = [len(example.input_ids) for example in examples]
    return Findings(rows=[
        Row(metric="SFT throughput, token-weighted trainer", unit="tokens/s", ours=best["weighted"],
            peers={"plain TRL SFTTrainer": best["plain"], "weighted on TRL's fused head": best["fused"]},
            ratios={"weighted/plain": ratio(best["weighted"], best["plain"]),
                    "fused-weighted/plain": ratio(best["fused"], best["plain"])},
            targets=[Target(on="weighted/plain", op=">=", limit=TARGET)]),
    ], notes=[
        f"{len(examples)} examples from react + oracle rollouts (one per model call), {min(lengths)}–"
        f"{max(lengths)} tokens each, batch size 1; a random Qwen3 (hidden {HIDDEN}, {LAYERS} layers, SmolLM2's "
        f"49k vocabulary), float32, {THREADS} CPU thread; {steps} optimizer steps per run, best of {rounds} "
        "alternating rounds. Tokens/s counts every token of the examples (prompt and completion).",
        "On a CPU, TRL's fused LM head scores every position in tiles (its compact path is for Triton devices); "
        "the weighted trainer instead asks the model for the logits of the trained positions only "
        "(`logits_to_keep`), hence a ratio above 1 here. 'weighted on TRL's fused head' is the same kernel as "
        "the floor plus the weighting: the cost of the weights alone. On a GPU the weighted trainer uses the "
        "fused head.",
    ])


MEASUREMENT = Measurement(
    name="sft_throughput",
    title="SFT throughput (orchard train sft)",
    method=("The same examples (react + oracle rollouts on swe-mini, SmolLM2's tokenizer), model (a random "
            "Qwen3) and settings trained for a fixed number of steps by plain TRL `SFTTrainer` and by Orchard's "
            "`WeightedSFTTrainer` (per-token weights), in alternating rounds; tokens per second of the training "
            "loop, best round of each."),
    run=run,
)
