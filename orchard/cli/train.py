"""`orchard train ...`: training recipes (orchard/recipes) on trajectories. One command per recipe; each
builds its settings from a config file and flags, then calls the library. Heavy imports (torch, TRL) happen
inside the commands, so `orchard --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from orchard.cli.sandbox import err, fail, out
from orchard.core.errors import OrchardError

app = typer.Typer(no_args_is_help=True, help="Train models on trajectories (orchard/recipes): one command per recipe.")


@app.command("sft")
def sft(
    inputs: Annotated[Optional[list[Path]], typer.Argument(
        help="`orchard eval` run directories or trajectories.jsonl files (or `inputs` in --config).",
        show_default=False)] = None,
    model: Annotated[Optional[Path], typer.Option(
        help="The student: a local Hugging Face model directory (see `orchard train export-smollm2`).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Output directory: checkpoints, metrics.json/.csv, loss.png, the final model in model/.")
    ] = None,
    config: Annotated[Optional[Path], typer.Option(
        help="Settings file (YAML or JSON, see docs/training.md); flags given here override it.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the last checkpoint in --out.")] = False,
    resolved_only: Annotated[Optional[bool], typer.Option(
        "--resolved-only/--any-outcome",
        help="Train unresolved rollouts only where step weights name their steps (default), or every call.")
    ] = None,
    harness: Annotated[Optional[list[str]], typer.Option(
        help="Keep only rollouts of this harness (repeatable).")] = None,
    from_model: Annotated[Optional[list[str]], typer.Option(
        help="Keep only rollouts of this model, as the trajectories name it (repeatable).")] = None,
    max_length: Annotated[Optional[int], typer.Option(
        help="Leave out examples longer than this many tokens (never truncated).")] = None,
    dedup: Annotated[Optional[bool], typer.Option("--dedup/--no-dedup", help="Leave out repeated examples.")
    ] = None,
    learning_rate: Annotated[Optional[float], typer.Option(help="Peak learning rate.")] = None,
    epochs: Annotated[Optional[float], typer.Option(help="Passes over the examples.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many optimizer steps.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Examples per device per micro-batch.")] = None,
    grad_accum: Annotated[Optional[int], typer.Option(help="Micro-batches per optimizer step.")] = None,
    save_steps: Annotated[Optional[int], typer.Option(help="A checkpoint every this many steps.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed.")] = None,
    bf16: Annotated[Optional[bool], typer.Option(
        "--bf16/--no-bf16", help="bfloat16 mixed precision (default: where the GPU supports it).")] = None,
    target_harness: Annotated[Optional[str], typer.Option(
        help="Translate every rollout into this harness's prompts and tools first (react, mini-swe-agent, "
             "kimi-cli, openhands; the last two run once per task to capture their prompts).")
    ] = None,
    credit_assignment: Annotated[bool, typer.Option(
        help="Also train the steps of failed rollouts that made progress (hindsight credit, sandboxes).")] = False,
    credit_config: Annotated[Optional[Path], typer.Option(
        help="Credit-assignment settings (YAML or JSON, see docs/training.md); implies --credit-assignment.")
    ] = None,
    credit_suite: Annotated[str, typer.Option(
        help="The task suite the rollouts attempted (reference patches and tests for credit).")] = "swe-mini",
) -> None:
    """Supervised fine-tuning on what the policy saw and produced in each recorded model call, with a
    per-token weighted loss (TRL SFTTrainer)."""
    from orchard.recipes.sft.config import SFTSettings

    try:
        settings = (SFTSettings.load(config) if config else SFTSettings()).with_overrides({
            "inputs": inputs or None, "model": model, "out": out_dir, "filters.resolved_only": resolved_only,
            "filters.harnesses": harness or None, "filters.models": from_model or None,
            "filters.max_length": max_length, "filters.dedup": dedup, "learning_rate": learning_rate,
            "num_train_epochs": epochs, "max_steps": max_steps, "per_device_train_batch_size": batch_size,
            "gradient_accumulation_steps": grad_accum, "save_steps": save_steps, "seed": seed, "bf16": bf16})
    except OrchardError as exc:
        fail(str(exc), code=2)
    report = None
    if target_harness or credit_assignment or credit_config:
        report = _translated_or_credited(settings, target_harness, credit_assignment or credit_config is not None,
                                         credit_config, credit_suite)
    run_sft_command(settings, resume=resume, report=report)


def _translated_or_credited(settings: Any, target_harness: str | None, credit: bool, credit_config: Path | None,
                            suite: str) -> Any:
    """The examples of --target-harness / --credit-assignment (orchard.recipes.credit.sft)."""
    from orchard.recipes.credit.sft import prepare_examples
    from orchard.recipes.credit.values import CreditSettings
    from orchard.recipes.sft.inputs import read_training_trajectories
    from orchard.recipes.sft.train import check_model_dir, load_tokenizer

    try:
        credit_settings = None
        if credit:
            import yaml
            from pydantic import ValidationError

            from orchard.core.errors import first_problem

            data = yaml.safe_load(credit_config.read_text()) if credit_config else {}
            try:
                credit_settings = CreditSettings.model_validate(data or {})
            except ValidationError as exc:
                fail(f"{credit_config}: {first_problem(exc, 'credit')}", code=2)
        tokenizer = load_tokenizer(check_model_dir(settings.model))
        with err.status("preparing the examples (translation, credit assignment in sandboxes)"):
            prepared = prepare_examples(read_training_trajectories(settings.inputs), tokenizer,
                                        filters=settings.filters, target_harness=target_harness,
                                        credit=credit_settings, suite=suite, out=settings.out)
    except (OrchardError, OSError, ValueError) as exc:
        fail(str(exc), code=2)
    if prepared.summary():
        out.print(escape(prepared.summary()))
    return prepared.report


def run_sft_command(settings: Any, *, resume: bool, report: Any = None) -> None:
    """Train, showing progress, and print what was trained on and where the results are."""
    from orchard.recipes.sft.train import run_sft

    with Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeRemainingColumn(), console=err, transient=True) as progress:
        try:
            result = run_sft(settings, resume=resume, report=report, callbacks=[_progress_callback(progress)],
                             disable_tqdm=True)
        except OrchardError as exc:
            progress.stop()
            fail(str(exc))
    report = result.report
    out.print(escape(report.summary()))
    if report.mismatches:
        first = report.mismatches[0]
        err.print(f"[yellow]{len(report.mismatches)} recorded token sequence(s) decode to other text than "
                  f"re-rendering the call (another tokenizer or template) and were not trained[/] (first: {escape(first.part)} of call {escape(first.source.llm_call_id)} at "
                  f"token {first.index}, finish_reason {escape(str(first.finish_reason))}); see metrics.json")
    if result.resumed_from is not None:
        out.print(f"resumed from {escape(str(result.resumed_from))}")
    out.print(f"{result.totals.get('global_step')} steps, final training loss "
              f"{result.totals.get('train_loss', float('nan')):.4f}; model in {escape(str(result.model_dir))}, "
              f"metrics in {escape(str(result.out))}")


def _progress_callback(progress: Progress) -> Any:
    from transformers import TrainerCallback

    class RichProgress(TrainerCallback):
        task = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.task = progress.add_task("", total=state.max_steps, completed=state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            progress.update(self.task, completed=state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and self.task is not None:
                progress.update(self.task, description=f"loss {logs['loss']:.4f}")

    return RichProgress()


@app.command("export-smollm2")
def export_smollm2_command(
    out_dir: Annotated[Path, typer.Argument(help="Directory to create (must not exist).")],
) -> None:
    """Write the embedded SmolLM2-135M-Instruct as a plain float32 model directory (~540 MB) for --model."""
    from orchard.recipes.common.smollm2_export import export_smollm2

    with err.status("dequantizing SmolLM2 from its GGUF file and saving it"):
        try:
            path = export_smollm2(out_dir)
        except OrchardError as exc:
            fail(str(exc))
    out.print(f"SmolLM2-135M-Instruct written to {escape(str(path))}; train it with "
              f"`orchard train sft RUN_DIR --model {escape(str(path))} --out OUT`")


@app.command("rl")
def rl(
    model: Annotated[str, typer.Option(
        help="The policy: a local model directory (e.g. `orchard train sft`'s model/), or tiny-qwen3 (a random "
             "tiny model, for smoke runs).")] = "tiny-qwen3",
    suite: Annotated[str, typer.Option(help="Task suite (a name under eval/ or a directory).")] = "swe-mini",
    task: Annotated[Optional[list[str]], typer.Option(help="Train on this task (repeatable; default: all).")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Output directory: final model, metrics.json.")
    ] = Path("runs/rl"),
    harness: Annotated[str, typer.Option(help="The harness the policy drives.")] = "react",
    step_limit: Annotated[int, typer.Option(help="Model calls per rollout at most.")] = 4,
    max_tokens: Annotated[int, typer.Option(help="Tokens per model call at most.")] = 128,
    steps: Annotated[int, typer.Option(help="Training steps.")] = 1,
    generations: Annotated[int, typer.Option(help="G: rollouts per task in a GRPO group.")] = 4,
    tasks_per_step: Annotated[int, typer.Option(help="Tasks (groups) per step.")] = 1,
    strategy: Annotated[str, typer.Option(
        help="How many rollouts each task gets: bar (balanced adaptive), dapo (zero-variance filter), fixed.")
    ] = "bar",
    retire_after: Annotated[int, typer.Option(
        help="BAR: retire a task whose rollouts all agreed over this many (for the rest of the run).")] = 5,
    max_rollouts: Annotated[Optional[int], typer.Option(
        help="BAR: rollouts per task per step at most (default: --generations, or --retire-after if larger).")
    ] = None,
    parallel: Annotated[int, typer.Option(help="Rollouts (sandboxes) at once.")] = 1,
    learning_rate: Annotated[float, typer.Option(help="Learning rate.")] = 1e-5,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    guide: Annotated[Optional[str], typer.Option(
        help="oracle: every --guide-every-th rollout of a task plays the oracle's replies (the reference patch), "
             "scored by the policy, so a group holds a success even where the policy never solves the task.")
    ] = None,
    guide_every: Annotated[int, typer.Option(help="With --guide: guide every N-th rollout of each task.")] = 2,
    guide_gamma: Annotated[float, typer.Option(
        help="With --guide: a guided token's loss is -A * p/(p + gamma) (LUFFY's policy shaping).")] = 0.1,
    importance_sampling: Annotated[bool, typer.Option(
        help="Weight each sampled token by min(pi_trainer/pi_sampler, --importance-sampling-cap) from the "
             "logprobs the gateway recorded (truncated IS: a stale or different sampler).")] = True,
    importance_sampling_cap: Annotated[float, typer.Option(help="C of truncated importance sampling.")] = 3.0,
    vllm_url: Annotated[Optional[str], typer.Option(
        help="Sample the policy from this vLLM OpenAI server (e.g. http://127.0.0.1:8000/v1) instead of "
             "in-process generation, prompts sent as token ids; --vllm-model names its model.")] = None,
    vllm_model: Annotated[Optional[str], typer.Option(help="The model name the vLLM server serves.")] = None,
    vllm_sync: Annotated[bool, typer.Option(
        help="With --vllm-url: before each step, save the trainer's weights and have the server reload them "
             "(start it with VLLM_SERVER_DEV_MODE=1); --no-vllm-sync leaves its weights as they started.")] = True,
) -> None:
    """GRPO (TRL GRPOTrainer) on real rollouts: the harness runs each task in a sandbox with the policy being
    trained served through the run's gateway, the grader gives the reward, and BAR decides how many
    rollouts each task gets. Prints each step's rollouts, rewards, loss and what was trained on."""
    from orchard.recipes.bar.config import BarConfig
    from orchard.recipes.bar.strategies import ALLOCATORS
    from orchard.recipes.rl.train import RLConfig, train_rl

    if strategy not in ALLOCATORS:
        fail(f"--strategy {strategy!r}: choose from {', '.join(ALLOCATORS)}", code=2)
    try:
        config = RLConfig(model=model, suite=suite, tasks=task or None, out=out_dir, harness=harness,
                          harness_options={"step_limit": step_limit}, max_tokens=max_tokens, max_steps=steps,
                          num_generations=generations, tasks_per_step=tasks_per_step, strategy=strategy,
                          parallel=parallel, learning_rate=learning_rate, temperature=temperature, seed=seed,
                          vllm_url=vllm_url, vllm_model=vllm_model, vllm_sync=vllm_sync,
                          guide=guide, guide_every=guide_every, guide_gamma=guide_gamma,
                          importance_sampling=importance_sampling, importance_sampling_cap=importance_sampling_cap,
                          bar=BarConfig(retire_after=retire_after, max_rollouts=max_rollouts))
    except ValueError as exc:
        fail(str(exc), code=2)
    try:
        with err.status("RL: running rollouts and training"):
            result = train_rl(config, on_step=_print_rl_step)
    except OrchardError as exc:
        fail(str(exc))
    losses = ", ".join(f"{loss:.4f}" for loss in result.losses) or "none logged"
    out.print(f"{result.steps} step(s), loss {losses}; weights changed: {result.weights_changed}; rollouts "
              f"{result.rollout_s:.1f} s, training {result.train_s:.1f} s; model and metrics.json in "
              f"{escape(str(result.out))}")


def _print_rl_step(report: Any) -> None:
    rewards = "; ".join(f"{escape(task_id)}: {['-' if r is None else f'{r:g}' for r in values]}"
                        for task_id, values in report.rewards.items())
    out.print(f"step {report.step}: {report.rollouts} rollouts ({report.errors} infrastructure errors, masked), "
              f"{report.informative_groups}/{len(report.rewards)} groups with signal; rewards {rewards}; "
              f"trained on {report.trained_tokens} policy tokens, {report.env_tokens} environment tokens masked")
    for rollout in report.rollout_log:
        reward = "masked (infrastructure error)" if rollout["reward"] is None else f"reward {rollout['reward']:g}"
        behaviour = {"guided": " (guided: the oracle's replies, scored by the policy)",
                     "sampled": " (sampled by the policy)"}.get(rollout.get("behaviour", ""), "")
        out.print(f"  rollout {escape(str(rollout['rollout_key']))}{behaviour}: {escape(str(rollout['exit_status']))}, "
                  f"{rollout['model_calls']} model calls, {rollout['sampled_tokens']} "
                  f"{'dictated' if rollout.get('behaviour') == 'guided' else 'sampled'} tokens, "
                  f"{rollout['environment_tokens']} environment tokens, {reward}")
    if report.retired:
        out.print(f"  retired (no signal): {escape(', '.join(f'{k} ({v})' for k, v in report.retired.items()))}")
    for drift in report.drifts:
        err.print(f"[yellow]token drift[/] {escape(drift)}")
