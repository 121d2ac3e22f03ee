"""`orchard export atif RUN_DIR OUT_DIR`: an evaluation run's trajectories as ATIF files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from orchard.cli.sandbox import err, fail, out
from orchard.core.errors import OrchardError

app = typer.Typer(no_args_is_help=True, help="Export trajectories to other formats.")


@app.command("atif")
def atif(
    run_dir: Annotated[Path, typer.Argument(help="The output directory of an `orchard eval` run.")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the ATIF files (created if needed).")],
    version: Annotated[Optional[str], typer.Option(
        help="ATIF version to write, e.g. ATIF-v1.7 (default: each trajectory's declared one, ATIF-v1.6 for "
             "Orchard's).")] = None,
) -> None:
    """Write each trajectory of RUN_DIR/trajectories.jsonl as one ATIF JSON file in OUT_DIR.

    Files are named <task id>--<rollout key>.json (characters other than letters, digits, '.', '_' and '-'
    replaced by '_') and written atomically. Orchard's own records (outcome, model calls, raw tool-call
    text, ...) are kept under `extra.orchard`, so the files import back into Orchard unchanged."""
    from orchard.eval.atif_export import export_atif

    with Progress(TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), console=err,
                  transient=True) as progress:
        task = progress.add_task("export", total=None)

        def written(path: Path, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            paths = export_atif(run_dir, out_dir, version=version, on_written=written)
        except OrchardError as exc:
            progress.stop()
            fail(str(exc))
    out.print(f"{len(paths)} ATIF file(s) written to {escape(str(out_dir))}")
