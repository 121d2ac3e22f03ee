"""What an SFT run writes beside its checkpoints, each file replaced atomically (readers never see half a file):

    OUT/metrics.json   the run: settings, the data (examples, tokens, what was skipped, token mismatches),
                       one entry per logged step, and the totals once training ends
    OUT/metrics.csv    the logged steps as a table
    OUT/loss.png       training loss per step (written at each checkpoint and at the end)

The steps come from the trainer's log history, which a resumed run restores from its checkpoint, so the files
always hold the whole run."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from orchard.core.atomic_write import atomic_write_bytes

METRICS_JSON, METRICS_CSV, LOSS_PLOT = "metrics.json", "metrics.csv", "loss.png"
STEP_COLUMNS = ("step", "epoch", "loss", "learning_rate", "grad_norm", "mean_token_accuracy", "num_tokens")


def logged_steps(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step training logs (not the end-of-training summary), one per step (a resumed run may have
    logged a step twice: the later one wins)."""
    steps: dict[int, dict[str, Any]] = {}
    for entry in log_history:
        if "loss" in entry:
            steps[int(entry["step"])] = {column: entry.get(column) for column in STEP_COLUMNS}
    return [steps[step] for step in sorted(steps)]


def write_metrics(out: Path, run: dict[str, Any], log_history: list[dict[str, Any]], *,
                  totals: dict[str, Any] | None = None) -> None:
    steps = logged_steps(log_history)
    document = {**run, "steps": steps, "train": totals}
    atomic_write_bytes(out / METRICS_JSON, (json.dumps(document, indent=2, default=str) + "\n").encode())
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=STEP_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(steps)
    atomic_write_bytes(out / METRICS_CSV, table.getvalue().encode())


def write_loss_plot(out: Path, log_history: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file
    from matplotlib.figure import Figure

    steps = logged_steps(log_history)
    figure = Figure(figsize=(6, 3.5), dpi=100)
    axes = figure.add_subplot()
    axes.plot([s["step"] for s in steps], [s["loss"] for s in steps], marker="o" if len(steps) < 30 else None)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("training loss (weighted)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write_bytes(out / LOSS_PLOT, buffer.getvalue())


class MetricsCallback(TrainerCallback):
    """Keeps the metrics files current while training: after every log, every checkpoint and at the end."""

    def __init__(self, out: Path, run: dict[str, Any], title: str) -> None:
        self.out, self.run, self.title = out, run, title

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero:
            write_metrics(self.out, self.run, state.log_history)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_loss_plot(self.out, state.log_history, self.title)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_loss_plot(self.out, state.log_history, self.title)
