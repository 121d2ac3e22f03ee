"""The results of a run as rich tables: one row per task, then the totals (errors apart from attempts)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from orchard.eval.cells import harness_options_text, model_settings_text, suite_text
from orchard.eval.matrix import MatrixRow
from orchard.eval.results import EvalResults, EvalSummary

STATUS_STYLE = {"resolved": "green", "failed": "red", "error": "yellow"}


def tasks_table(results: EvalResults, *, error_width: int = 60) -> Table:
    table = Table(title=f"{results.label} — run {results.run_id}", title_justify="left")
    for column, justify in (("task", "left"), ("status", "left"), ("exit status", "left"), ("attempt", "right"),
                            ("steps", "right"),
                            ("LLM calls", "right"), ("tokens", "right"), ("cost $", "right"),
                            ("wall s", "right"), ("CPU s", "right"), ("start ms", "right"), ("error", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in results.tasks:
        tokens = (row.prompt_tokens or 0) + (row.completion_tokens or 0)
        table.add_row(row.task_id, Text(row.status, style=STATUS_STYLE[row.status]),
                      (row.exit_status or "-") + (" (partial)" if row.partial else ""), str(row.attempt),
                      str(row.steps), str(row.n_llm_calls), f"{tokens:,}" if tokens else "-",
                      f"{row.cost_usd:.4f}" if row.cost_usd is not None else "-",
                      _seconds(row.wall_time_s), _seconds(row.sandbox_cpu_s, digits=2),
                      f"{row.sandbox_startup.total_ms:.0f}" if row.sandbox_startup else "-",
                      _shorten(row.error or "", error_width))
    return table


def summary_line(summary: EvalSummary) -> Text:
    rate = f"{summary.resolve_rate:.0%}" if summary.resolve_rate is not None else "n/a"
    text = Text()
    text.append(f"resolved {summary.resolved}/{summary.finished} ({rate})", style="bold green")
    text.append(f", failed {summary.failed}", style="red")
    text.append(f", errors {summary.errors} (not counted as attempts)", style="yellow")
    if summary.pending:
        text.append(f", not run {summary.pending}", style="dim")
    if summary.by_exit_status:
        text.append("; ended by " + ", ".join(f"{status} {count}" for status, count in summary.by_exit_status.items()))
    text.append(f"; {summary.wall_time_s:.1f} s")
    text.append(f"; {summary.total_tokens:,} tokens")
    if summary.cost_usd is not None:
        text.append(f", ${summary.cost_usd:.4f}")
    if summary.sandbox_startup_p50_ms:
        text.append("; sandbox start p50 " + startup_text(summary.sandbox_startup_p50_ms), style="dim")
    return text


def startup_text(stages_ms: dict[str, float]) -> str:
    """`total 62 ms (backend create 20, agent start 38, first health 1)`: a start by stage, in ms."""
    parts = [f"{name.removesuffix('_ms').replace('_', ' ')} {value:.0f}" for name, value in stages_ms.items()
             if name != "total_ms" and value is not None]
    total = stages_ms.get("total_ms")
    head = f"total {total:.0f} ms" if total is not None else "ms"
    return head + (f" ({', '.join(parts)})" if parts else "")


def _seconds(value: float | None, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if value is not None else "-"


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def matrix_table(rows: list[MatrixRow], title: str = "harness × model") -> Table:
    """The study's matrix, one row per cell (a configuration: harness and model with their options): tasks
    and attempts, the resolve rate with its bootstrap interval, then steps, tokens and wall time per attempt;
    errors and tasks never run apart (they are not attempts); last the paired difference to the first harness
    with the same model."""
    table = Table(title=title, title_justify="left")
    for column, justify in (("suite", "left"), ("harness", "left"), ("model", "left"), ("tasks", "right"),
                            ("att./task", "right"), ("resolved", "right"), ("rate", "right"), ("95% CI", "right"),
                            ("errors", "right"), ("not run", "right"),
                            ("steps/att.", "right"), ("tokens/att.", "right"), ("wall s/att.", "right"),
                            ("Δ vs first harness (95% CI)", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        interval = row.interval
        confidence = f"{interval.low:.0%}–{interval.high:.0%}" if interval else "-"
        per_task = row.attempts_per_task
        table.add_row(row.suite_text, row.harness_text, row.model_text, str(row.finished),
                      f"{per_task:.3g}" if per_task is not None else "-", f"{row.resolved}/{row.attempts}",
                      Text(f"{row.resolve_rate:.0%}" if row.resolve_rate is not None else "n/a", style="bold"),
                      confidence, Text(str(row.errors), style="yellow" if row.errors else ""),
                      str(row.pending) if row.pending else "-",
                      f"{row.mean_steps:.1f}" if row.mean_steps is not None else "-",
                      f"{row.mean_tokens:,.0f}" if row.mean_tokens is not None else "-",
                      _seconds(row.mean_wall_s), versus_text(row))
    return table


def runs_table(runs: list[EvalResults], title: str = "runs") -> Table:
    """One row per run with what tells its cell apart: the harness's version and options, the model's
    settings, the suite's content hash; then its tasks and outcomes."""
    table = Table(title=title, title_justify="left")
    for column, justify in (("run", "left"), ("harness", "left"), ("harness options", "left"), ("model", "left"),
                            ("model settings", "left"), ("suite", "left"), ("tasks", "right"),
                            ("resolved", "right"), ("failed", "right"), ("errors", "right"), ("not run", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for results in runs:
        config, summary = results.settings.config(), results.summary
        harness = config.harness + (f" {config.harness_version}" if config.harness_version else "")
        table.add_row(results.run_id, harness, harness_options_text(config) or "-", config.model,
                      model_settings_text(config) or "-", suite_text(config), str(summary.total),
                      str(summary.resolved), str(summary.failed), str(summary.errors), str(summary.pending))
    return table


def versus_text(row: MatrixRow) -> str:
    """`+25% [+21%, +29%] vs react`: the paired difference to the first harness with the same model."""
    versus = row.versus
    if versus is None:
        return "-"
    return f"{versus.delta:+.0%} [{versus.interval.low:+.0%}, {versus.interval.high:+.0%}] vs {versus.baseline}"
