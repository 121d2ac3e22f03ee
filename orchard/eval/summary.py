"""The results of a run as rich tables: one row per task, then the totals (errors apart from attempts); with
several attempts per task, each task's attempts and its pass@k and pass^k at the run's K."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from orchard.eval.cells import harness_options_text, model_settings_text, suite_text
from orchard.eval.domains import DomainRow
from orchard.eval.estimators import PassK
from orchard.eval.matrix import MatrixRow
from orchard.eval.results import EvalResults, EvalSummary

STATUS_STYLE = {"resolved": "green", "failed": "red", "error": "yellow"}


def tasks_table(results: EvalResults, *, error_width: int = 60) -> Table:
    """One row per task, its latest rollout; with K attempts per task also its attempts ("2 of 3" while it
    is short of them), how many resolved, and its pass@K and pass^K ("n/a" while it has fewer than K)."""
    k = results.settings.attempts
    table = Table(title=f"{results.label} — run {results.run_id}", title_justify="left")
    columns = [("task", "left"), ("status", "left"), ("exit status", "left"), ("attempt", "right")]
    if k > 1:
        columns += [("attempts", "right"), ("resolved", "right"), (f"pass@{k}", "right"), (f"pass^{k}", "right")]
    columns += [("steps", "right"), ("LLM calls", "right"), ("tokens", "right"), ("cost $", "right"),
                ("wall s", "right"), ("CPU s", "right"), ("start ms", "right"), ("error", "left")]
    for column, justify in columns:
        table.add_column(column, justify=justify, overflow="fold")
    for row in results.tasks:
        tokens = (row.prompt_tokens or 0) + (row.completion_tokens or 0)
        cells = [row.task_id, Text(row.status, style=STATUS_STYLE[row.status]),
                 (row.exit_status or "-") + (" (partial)" if row.partial else ""), str(row.attempt)]
        if k > 1:
            at_k = row.pass_k(k)
            count = len(row.attempts)
            cells += [Text(f"{count} of {k}", style="yellow") if count < k else str(count),
                      str(row.resolved_attempts), rate_text(at_k.pass_at_k), rate_text(at_k.pass_hat_k)]
        cells += [str(row.steps), str(row.n_llm_calls), f"{tokens:,}" if tokens else "-",
                  f"{row.cost_usd:.4f}" if row.cost_usd is not None else "-",
                  _seconds(row.wall_time_s), _seconds(row.sandbox_cpu_s, digits=2),
                  f"{row.sandbox_startup.total_ms:.0f}" if row.sandbox_startup else "-",
                  _shorten(row.error or "", error_width)]
        table.add_row(*cells)
    return table


def rate_text(value: float | None) -> str:
    """`67%`; `n/a` for an estimate that does not exist (fewer attempts than k)."""
    return "n/a" if value is None else f"{value:.0%}"


def pass_k_text(pass_k: list[PassK]) -> str:
    """`pass@1 67%, pass@2 100%; pass^2 33%` (k = 1 once: pass^1 = pass@1); a k some task has too few
    attempts for reads `n/a (1 task short)`."""
    def one(value: float | None, entry: PassK) -> str:
        return rate_text(value) + (f" ({entry.short} task(s) short)" if value is None and entry.short else "")

    at = ", ".join(f"pass@{entry.k} {one(entry.pass_at_k, entry)}" for entry in pass_k)
    hat = ", ".join(f"pass^{entry.k} {one(entry.pass_hat_k, entry)}" for entry in pass_k if entry.k > 1)
    return at + (f"; {hat}" if hat else "")


def summary_line(summary: EvalSummary) -> Text:
    rate = f"{summary.resolve_rate:.0%}" if summary.resolve_rate is not None else "n/a"
    k = summary.attempts_per_task
    text = Text()
    if k == 1:
        text.append(f"resolved {summary.resolved}/{summary.finished} ({rate})", style="bold green")
        text.append(f", failed {summary.failed}", style="red")
        text.append(f", errors {summary.errors} (not counted as attempts)", style="yellow")
    else:
        text.append(f"resolved {summary.resolved}/{summary.attempts} attempts ({rate}, the mean over "
                    f"{summary.finished} task(s))", style="bold green")
        text.append(f", failed {summary.failed}", style="red")
        text.append(f", error rollouts {summary.error_rollouts} (not attempts)", style="yellow")
        if summary.short:
            text.append(f", {summary.short} task(s) short of {k} attempts", style="yellow")
        if summary.pass_k:
            text.append("; " + pass_k_text(summary.pass_k), style="bold")
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
    and attempts, the resolve rate with its Wilson interval, pass@k and pass^k at the cell's K (when a cell
    has more than one attempt per task), then steps, tokens and wall time per attempt; errors and tasks never
    run apart (they are not attempts); last the paired difference to the first harness with the same model."""
    repeated = any(row.k > 1 for row in rows)
    table = Table(title=title, title_justify="left")
    columns = [("suite", "left"), ("harness", "left"), ("model", "left"), ("tasks", "right"), ("att./task", "right"),
               ("resolved", "right"), ("rate", "right"), ("95% CI", "right")]
    if repeated:
        columns += [("pass@k", "right"), ("pass^k", "right")]
    columns += [("errors", "right"), ("not run", "right"), ("steps/att.", "right"), ("tokens/att.", "right"),
                ("wall s/att.", "right"), ("Δ vs first harness (95% CI)", "right")]
    for column, justify in columns:
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        interval = row.interval
        confidence = f"{interval.low:.0%}–{interval.high:.0%}" if interval else "-"
        per_task = row.attempts_per_task
        cells = [row.suite_text, row.harness_text, row.model_text, str(row.finished),
                 f"{per_task:.3g}" if per_task is not None else "-", f"{row.resolved}/{row.attempts}",
                 Text(f"{row.resolve_rate:.0%}" if row.resolve_rate is not None else "n/a", style="bold"), confidence]
        if repeated:
            top = row.pass_k[-1] if row.pass_k else None
            cells += [f"k={top.k}: {rate_text(top.pass_at_k)}" if top else "-",
                      f"k={top.k}: {rate_text(top.pass_hat_k)}" if top else "-"]
        cells += [Text(str(row.errors), style="yellow" if row.errors else ""), str(row.pending) if row.pending else "-",
                  f"{row.mean_steps:.1f}" if row.mean_steps is not None else "-",
                  f"{row.mean_tokens:,.0f}" if row.mean_tokens is not None else "-",
                  _seconds(row.mean_wall_s), versus_text(row)]
        table.add_row(*cells)
    return table


def domain_table(rows: list[DomainRow], title: str = "per domain: each harness with each model") -> Table:
    """The matrix per domain (orchard.eval.domains): one row per domain × harness × model, the domain's tasks
    pooled over the suites run; tasks and attempts, the resolve rate with its Wilson interval, and pass@k and
    pass^k for every k up to the row's K."""
    table = Table(title=title, title_justify="left")
    for column, justify in (("domain", "left"), ("harness", "left"), ("model", "left"), ("suites", "left"),
                            ("tasks", "right"), ("resolved", "right"), ("rate", "right"), ("95% CI", "right"),
                            ("pass@k; pass^k", "left"), ("errors", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        interval = row.interval
        table.add_row(row.domain, row.harness, row.model, ", ".join(row.suites), str(row.finished),
                      f"{row.resolved}/{row.attempts}", Text(rate_text(row.resolve_rate), style="bold"),
                      f"{interval.low:.0%}–{interval.high:.0%}" if interval else "-",
                      pass_k_text(row.pass_k) or "-", Text(str(row.errors), style="yellow" if row.errors else ""))
    return table


def runs_table(runs: list[EvalResults], title: str = "runs") -> Table:
    """One row per run with what tells its cell apart: the harness's version and options, the model's
    settings, the suite's content hash; then its tasks, its resolved and failed attempts and its errored
    rollouts."""
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
                      str(summary.resolved), str(summary.failed), str(summary.errored_rollouts),
                      str(summary.pending))
    return table


def versus_text(row: MatrixRow) -> str:
    """`+25% [+21%, +29%] vs react`: the paired difference to the first harness with the same model."""
    versus = row.versus
    if versus is None:
        return "-"
    return f"{versus.delta:+.0%} [{versus.interval.low:+.0%}, {versus.interval.high:+.0%}] vs {versus.baseline}"
