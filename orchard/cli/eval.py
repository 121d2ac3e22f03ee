"""`orchard eval`: run a harness with a model over a task suite (`orchard eval --harness H --model M
--suite S`), and check a suite's tasks in sandboxes (`orchard eval validate --suite S`). Thin over
`orchard.eval`; the progress bar and tables are drawn here."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchard.cli.sandbox import err, fail, key_values, out
from orchard.core.errors import InvalidRequest, NotFound, OrchardError, SandboxNotFound

app = typer.Typer(help="Evaluate a harness with a model on a task suite; `orchard eval validate` checks a suite.",
                  invoke_without_command=True, no_args_is_help=False, pretty_exceptions_enable=False)

UrlOption = Annotated[Optional[str], typer.Option(
    "--url", envvar="ORCHARD_URL", show_envvar=True,
    help="Orchard server for the sandboxes; default: an orchestrator in this process (see --backend).")]
BackendOption = Annotated[Optional[str], typer.Option(
    "--backend", help="Without --url: where this process's orchestrator runs the sandboxes (`orchard backend "
                      "list`; default local), configured from the environment (e.g. DOCKER_HOST, ORCHARD_K8S_*). "
                      "A task with image 'host' runs in the backend's default image there.")]
SuiteOption = Annotated[Optional[str], typer.Option(
    "--suite", help="A built-in suite name (e.g. swe-mini; claw-bench: the installed package's) or a suite "
                    "directory.")]
TasksOption = Annotated[Optional[str], typer.Option(
    "--tasks", help="Comma-separated task ids (default: every task of the suite).")]
ParallelOption = Annotated[int, typer.Option(
    "--parallel", min=1, help="Tasks whose agent runs at once (as many gradings may run beside them).")]
JudgeModelOption = Annotated[Optional[str], typer.Option(
    "--judge-model", envvar="ORCHARD_JUDGE_MODEL", show_envvar=True,
    help="The LLM judge of tasks scored by a rubric (Claw-Eval's judge_rubric), called through the run's gateway "
         "(any model it serves); without it such tasks are not runnable (docs/claw.md).")]
ClawEvalServicesOption = Annotated[Optional[Path], typer.Option(
    "--claw-eval-services", envvar="ORCHARD_CLAW_EVAL_SERVICES", show_envvar=True, exists=True, file_okay=False,
    help="A Claw-Eval checkout holding mock_services/: Claw-Eval tasks run their services from it (docs/claw.md).")]


@app.callback()
def eval_command(
    ctx: typer.Context,
    harness: Annotated[Optional[str], typer.Option(help="Harness name (see `orchard harness list`).")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="One of Orchard's own models (see `orchard model list`), a gateway alias, or any litellm model "
             "string.")] = None,
    suite: SuiteOption = None,
    tasks: TasksOption = None,
    parallel: ParallelOption = 4,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="Output directory (default runs/<harness>-<model>-<suite>). Re-running into it resumes.")
    ] = None,
    max_steps: Annotated[Optional[int], typer.Option(
        "--max-steps", min=1, help="Most agent steps (model calls) per task: the harness option step_limit.")] = None,
    harness_option: Annotated[Optional[list[str]], typer.Option(
        "--harness-option", help="KEY=VALUE passed to the harness (VALUE read as JSON if it parses). Repeatable.")
    ] = None,
    api_base: Annotated[Optional[str], typer.Option(
        help="The model's OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1 (with --model openai/NAME).")
    ] = None,
    api_key: Annotated[Optional[str], typer.Option(
        envvar="ORCHARD_MODEL_API_KEY", show_envvar=True, help="The model server's API key.")] = None,
    gateway_config: Annotated[Optional[Path], typer.Option(
        help="A gateway config file (JSON/YAML) with model aliases (see docs/gateway.md).")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0, help="Sampling temperature.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", min=1, help="Most tokens the model may generate per call.")] = None,
    task_timeout: Annotated[float, typer.Option(
        "--task-timeout", min=1, help="Seconds the agent may run on one task; past it the trial is a `timeout` "
                                      "error (its steps so far kept).")] = 1800.0,
    trial_timeout: Annotated[float, typer.Option(
        "--trial-timeout", min=1, help="Seconds one whole trial may take: setup, agent, patch and grading.")
    ] = 3600.0,
    allow_errors: Annotated[bool, typer.Option(
        "--allow-errors", help="Exit 0 even when some rollouts ended in an error.")] = False,
    url: UrlOption = None,
    backend: BackendOption = None,
    pool: Annotated[int, typer.Option(
        "--pool", min=0, help="Keep N sandboxes of each task template started, so trials claim them instead of "
                              "starting cold (the run's own orchestrator only; see docs/pools.md).")] = 0,
    attempts: Annotated[int, typer.Option(
        "--attempts", min=1, help="Finished attempts (resolved or failed) each task gets, for pass@k and pass^k. "
                                  "A rollout that ends in an error is not an attempt (see --error-retries).")] = 1,
    error_retries: Annotated[int, typer.Option(
        "--error-retries", min=0, help="At most N more rollouts per task in this run to replace rollouts that "
                                       "ended in an error; a task still short of attempts says how many it has, "
                                       "and re-running the same command runs the missing ones.")] = 0,
    pass_threshold: Annotated[Optional[float], typer.Option(
        "--pass-threshold", help="A rollout is resolved when its reward (0 to 1) is at least this; default: the "
                                 "suite's pass_threshold (suite.json), else 1.0.")] = None,
    judge_model: JudgeModelOption = None,
    claw_eval_services: ClawEvalServicesOption = None,
    user_model: Annotated[Optional[str], typer.Option(
        "--user-model", help="The model that plays the simulated user of multi-turn tasks (any model the run's "
                             "gateway serves: Orchard's own, an alias of --gateway-config, a litellm name); its "
                             "calls are recorded apart from the agent's. Default: each user follows its task's "
                             "script (docs/claw.md).")] = None,
) -> None:
    """Evaluate HARNESS with MODEL on SUITE: one trial per task (sandbox, harness, patch, grading in a fresh
    sandbox).

    Writes OUT/config.json, OUT/trajectories.jsonl (one graded trajectory per rollout), OUT/calls.jsonl
    (every model call) and OUT/results.json, and prints a table. Errors (model, sandbox, grader failures,
    timeouts) are shown apart and are not counted as attempts; re-running the same command resumes and runs
    them again.

    Exit status: 0 when every task has its attempts (resolved or failed rollouts); 1 when a task is short of
    them because a rollout ended in an error (unless --allow-errors); 2 for bad usage; 130 when interrupted."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [name for name, value in (("--harness", harness), ("--model", model), ("--suite", suite)) if not value]
    if missing:
        fail(f"missing {', '.join(missing)}: `orchard eval --harness react --model oracle --suite swe-mini` "
             "(see `orchard eval --help`)", code=2)
    from orchard.core.harness import SamplingParams
    from orchard.eval.models import eval_gateway_config
    from orchard.eval.run_config import TrialTimeouts
    from orchard.eval.runner import run_eval

    _claw_eval_settings(judge_model, claw_eval_services)
    options = _harness_options(harness_option or [])
    if max_steps is not None:
        options["step_limit"] = max_steps
    target = out_dir or Path("runs") / _slug(f"{harness}-{model}-{Path(suite).name}")
    listener = ProgressListener(f"{harness} × {model}")
    try:
        timeouts = TrialTimeouts(trial_s=trial_timeout, agent_s=task_timeout)
        config = eval_gateway_config(model, api_base=api_base, api_key=api_key, config=gateway_config)
        with listener:
            results = asyncio.run(run_eval(
                harness=harness, model=model, suite=suite, out_dir=target, gateway_config=config,
                task_ids=_split(tasks), parallel=parallel, harness_options=options,
                sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens), timeouts=timeouts,
                orchard_url=url, backend=backend, listener=listener, pool=pool, attempts=attempts,
                error_retries=error_retries, pass_threshold=pass_threshold, user_model=user_model))
    except OrchardError as exc:
        fail_with(exc)
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted: every sandbox was deleted; finished tasks are kept in {escape(str(target))}. "
                  "Run the same command again to resume.[/]")
        raise typer.Exit(130) from None
    print_results(results)
    out.print(f"trajectories and results: {escape(str(target))}")
    summary = results.summary
    lacking = max(summary.errors, summary.short)  # with one attempt per task the same tasks
    if lacking and not allow_errors:
        what = "ended in an error" if summary.attempts_per_task == 1 else (
            f"have fewer than {summary.attempts_per_task} attempts: rollouts ended in an error")
        err.print(f"[yellow]{lacking} task(s) {what} (not an attempt of the agent); run the same command again to "
                  "retry them, or pass --allow-errors to exit 0 anyway[/]")
        raise typer.Exit(1)


@app.command("validate")
def validate_command(suite: SuiteOption = "swe-mini", tasks: TasksOption = None, parallel: ParallelOption = 4,
                     url: UrlOption = None, backend: BackendOption = None, judge_model: JudgeModelOption = None,
                     claw_eval_services: ClawEvalServicesOption = None) -> None:
    """Check a suite in sandboxes with the evaluator's grader: for every task the gold patch (SWE) or the
    reference solution (Harbor's, claw-bench's solve.sh) must resolve it, and the empty patch or a no-op must
    not. Exits 1 if any task is invalid or cannot run. (A rubric's judge is not called here: such a task is
    checked on its deterministic part.)"""
    from orchard.eval.validation import validate_suite

    _claw_eval_settings(judge_model, claw_eval_services)

    try:
        with err.status(f"validating {suite} in sandboxes..."):
            checks = asyncio.run(validate_suite(suite, _split(tasks), parallel=parallel, orchard_url=url,
                                                  backend=backend))
    except OrchardError as exc:
        fail_with(exc)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    table = Table("task", "status", "gold patch / solution", "empty patch / no-op", "s",
                  title=f"suite {suite}: the reference fix and doing nothing")
    for check in checks:
        status = "[green]ok[/]" if check.valid else "[red]NOT RUNNABLE[/]" if check.not_runnable else "[red]INVALID[/]"
        table.add_row(check.task_id, status,
                      _verdict(check.gold_resolved, check.gold_reward),
                      _verdict(check.empty_resolved, check.empty_reward), f"{check.duration_s:.1f}")
    out.print(table)
    for check in checks:
        for problem in check.problems:
            out.print(f"[red]{escape(check.task_id)}[/]: {escape(problem)}")
    invalid = sum(1 for check in checks if not check.valid)
    out.print(f"{len(checks)} task(s), {invalid} invalid")
    not_runnable = [check.task_id for check in checks if check.not_runnable]
    if not_runnable:
        out.print(f"{len(not_runnable)} not runnable (the reasons above): {', '.join(not_runnable)}")
    partial = [f"{check.task_id} {check.empty_reward:.2g}" for check in checks if check.noop_partial_credit]
    if partial:
        out.print(f"{len(partial)} no-op(s) not resolved but earning partial credit: {', '.join(partial)}")
    by_design = [check.task_id for check in checks if check.noop_resolves_by_design]
    if by_design:
        out.print(f"{len(by_design)} no-op(s) resolve by the task's design (doing nothing is its right answer, "
                  f"metadata noop_resolves): {', '.join(by_design)}")
    if invalid:
        raise typer.Exit(1)


def _claw_eval_settings(judge_model: str | None, services: Path | None) -> None:
    """Claw-Eval tasks read these when the suite loads (orchard/eval/dialects/claw_eval.py)."""
    from orchard.eval.dialects.claw_eval import JUDGE_ENV, SERVICES_ENV

    if judge_model:
        os.environ[JUDGE_ENV] = judge_model
    if services is not None:
        os.environ[SERVICES_ENV] = str(services.resolve())


def fail_with(exc: OrchardError) -> None:
    """The error on one line; exit 2 for bad input (what the user gave is refused before anything runs, as
    typer's own usage errors), 1 for anything else."""
    usage = isinstance(exc, (InvalidRequest, NotFound)) and not isinstance(exc, SandboxNotFound)
    fail(str(exc), code=2 if usage else 1)


class ProgressListener:
    """A rich progress bar: tasks done of those to run, with resolved / failed / error counts."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.counts = {"resolved": 0, "failed": 0, "error": 0}
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), console=err,
                                 transient=False)
        self.bar = None
        self.step = None
        self.trials = 0

    def __enter__(self) -> ProgressListener:
        self.progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.progress.stop()

    def preparing(self, step: str) -> None:
        """A line that follows the run's preparation (an in-sandbox harness's bundle being built)."""
        if self.step is None:
            self.step = self.progress.add_task("", total=None, counts="")
        self.progress.update(self.step, description=f"preparing: {escape(step)}")

    def run_started(self, results, to_run: list[str]) -> None:
        if self.step is not None:
            self.progress.remove_task(self.step)
            self.step = None
        skipped = results.summary.total - len(set(to_run))
        if skipped:
            err.print(f"resuming run {results.run_id}: {skipped} task(s) already finished are skipped")
        self.trials = len(to_run)
        self.bar = self.progress.add_task(escape(self.label), total=self.trials, counts=self._counts())

    def retrying(self, task_id: str) -> None:
        """A rollout of `task_id` ended in an error and another replaces it: one more trial to wait for."""
        self.trials += 1
        self.progress.update(self.bar, total=self.trials)

    def task_finished(self, result) -> None:
        self.counts[result.status] += 1
        self.progress.update(self.bar, advance=1, counts=self._counts())

    def _counts(self) -> str:
        return (f"[green]{self.counts['resolved']} resolved[/] [red]{self.counts['failed']} failed[/] "
                f"[yellow]{self.counts['error']} error[/]")


def print_results(results) -> None:
    from orchard.eval.summary import summary_line, tasks_table

    # Piped or logged: wide enough that each task stays on one line (rich would fold to 80 columns).
    console = out if out.is_terminal or os.environ.get("COLUMNS") else Console(width=200, highlight=False)
    console.print(tasks_table(results))
    console.print(summary_line(results.summary))
    for row in results.tasks:  # in full: the table's column is cut to fit
        if row.status == "error":
            # One line each, never folded at the terminal's width: scripts and tests match them.
            console.print(Text(f"{row.task_id} [{row.exit_status}]: {row.error}", style="yellow"), soft_wrap=True)


def _harness_options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, value in key_values(pairs, "--harness-option").items():
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _split(tasks: str | None) -> list[str] | None:
    ids = [part.strip() for part in (tasks or "").split(",") if part.strip()]
    return ids or None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _verdict(resolved: bool | None, reward: float | None = None) -> str:
    verdict = "-" if resolved is None else ("resolved" if resolved else "not resolved")
    return verdict if reward is None else f"{verdict} ({reward:.2g})"
