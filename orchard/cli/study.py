"""`orchard study`: a cross-harness study, every harness × every model on one suite (one `orchard eval` run
per cell into OUT/<harness>__<model>/), then the matrix. Thin over `orchard.eval.study`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from orchard.cli.eval import (BackendOption, ParallelOption, ProgressListener, SuiteOption, TasksOption, UrlOption,
                              _harness_options, _split, fail_with)
from orchard.cli.report import print_matrix
from orchard.cli.sandbox import err, fail, out
from orchard.core.errors import OrchardError

app = typer.Typer(help="Run every harness × every model on a suite (a cross-harness study) and show the matrix.",
                  invoke_without_command=True, no_args_is_help=False, pretty_exceptions_enable=False)


@app.callback()
def study_command(
    harness: Annotated[Optional[str], typer.Option(
        help="Comma-separated harness names (see `orchard harness list`).")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="Comma-separated models (see `orchard model list`; gateway aliases, litellm model strings).")] = None,
    suite: SuiteOption = None,
    tasks: TasksOption = None,
    parallel: ParallelOption = 4,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out", help="The study's directory (default studies/<suite>). Re-running into it resumes every cell.")
    ] = None,
    max_steps: Annotated[Optional[int], typer.Option(
        "--max-steps", min=1, help="Most agent steps (model calls) per task: the harness option step_limit.")] = None,
    harness_option: Annotated[Optional[list[str]], typer.Option(
        "--harness-option", help="KEY=VALUE passed to every harness (VALUE read as JSON if it parses).")] = None,
    gateway_config: Annotated[Optional[Path], typer.Option(
        help="A gateway config file (JSON/YAML) with model aliases (see docs/gateway.md).")] = None,
    task_timeout: Annotated[float, typer.Option(
        "--task-timeout", min=1, help="Seconds the agent may run on one task.")] = 1800.0,
    trial_timeout: Annotated[float, typer.Option(
        "--trial-timeout", min=1, help="Seconds one whole trial may take.")] = 3600.0,
    report: Annotated[Optional[Path], typer.Option(
        "--report", help="The HTML report to write (default OUT/report.html).")] = None,
    allow_errors: Annotated[bool, typer.Option(
        "--allow-errors", help="Exit 0 even when some cells failed or some rollouts ended in an error.")] = False,
    url: UrlOption = None,
    backend: BackendOption = None,
    attempts: Annotated[int, typer.Option(
        "--attempts", min=1, help="Finished attempts (resolved or failed) each task gets in every cell, for pass@k "
                                  "and pass^k; errors are not attempts.")] = 1,
    error_retries: Annotated[int, typer.Option(
        "--error-retries", min=0, help="At most N more rollouts per task and cell to replace rollouts that ended "
                                       "in an error.")] = 0,
) -> None:
    """Evaluate every HARNESS with every MODEL on SUITE, one `orchard eval` run per cell into
    OUT/<harness>__<model>/, one cell after another; then print the matrix (resolve rate with a 95% Wilson
    interval, pass@k and pass^k with --attempts, steps, tokens, wall time per attempt, errors apart) and
    write OUT/report.html.

    A cell that cannot run (an unknown harness, a bundle that does not build) is recorded in OUT/study.json
    and the next cell runs. Re-running the same command resumes: finished tasks are kept, errors run again.

    Exit status: 0 when every cell ran and every task has its attempts; 1 otherwise (unless
    --allow-errors); 2 for bad usage; 130 when interrupted."""
    harnesses, models = _split(harness) or [], _split(model) or []
    missing = [name for name, value in (("--harness", harnesses), ("--model", models), ("--suite", suite))
               if not value]
    if missing:
        fail(f"missing {', '.join(missing)}: `orchard study --harness react,mini-swe-agent --model oracle "
             "--suite swe-mini` (see `orchard study --help`)", code=2)
    from orchard.eval.models import check_model_route, eval_gateway_config
    from orchard.eval.report import load_runs, unrun_cells, write_report
    from orchard.eval.run_config import TrialTimeouts
    from orchard.eval.study import eval_cell, run_study

    options = _harness_options(harness_option or [])
    if max_steps is not None:
        options["step_limit"] = max_steps
    target = out_dir or Path("studies") / Path(suite).name

    def on_cell(cell, results) -> None:
        if cell.status == "failed":
            err.print(f"[yellow]{escape(cell.harness)} × {escape(cell.model)} did not run: "
                      f"{escape(cell.error or '')}[/]")

    try:
        configs = {name: eval_gateway_config(name, config=gateway_config) for name in models}
        for name, config in configs.items():  # bad input refuses the study, before any cell runs
            check_model_route(config, name)
        timeouts = TrialTimeouts(trial_s=trial_timeout, agent_s=task_timeout)

        async def run_cell(cell, directory):
            listener = ProgressListener(f"{cell.harness} × {cell.model}")
            with listener:  # each cell's own progress bar, drawn while it runs
                runner = eval_cell(suite, configs, task_ids=_split(tasks), parallel=parallel,
                                   harness_options=options, timeouts=timeouts, orchard_url=url, backend=backend,
                                   listener=lambda _: listener, attempts=attempts, error_retries=error_retries)
                return await runner(cell, directory)

        study = asyncio.run(run_study(harnesses=harnesses, models=models, suite=suite, out_dir=target,
                                      run_cell=run_cell, on_cell=on_cell))
        runs = load_runs([target]) if any(cell.status != "failed" for cell in study.cells) else []
        unrun = unrun_cells([target])
        html = write_report(runs, report or target / "report.html", unrun)
    except OrchardError as exc:
        fail_with(exc)
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted: finished tasks are kept in {escape(str(target))}. Run the same command "
                  "again to resume.[/]")
        raise typer.Exit(130) from None
    print_matrix(runs, unrun)
    out.print(f"study: {escape(str(target))}; report: {escape(str(html))}")
    # This command's cells: a study run again with fewer harnesses answers for those it ran.
    incomplete = [cell for cell in study.cells
                  if cell.harness in harnesses and cell.model in models and cell.status != "finished"]
    if incomplete and not allow_errors:
        err.print(f"[yellow]{len(incomplete)} cell(s) did not finish cleanly (a cell failed, or rollouts ended in "
                  "an error: not attempts); run the same command again to retry them, or pass --allow-errors[/]")
        raise typer.Exit(1)

