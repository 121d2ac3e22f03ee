"""A cross-harness study: every harness × every model on one suite, one `orchard eval` run per cell.

    OUT/study.json               the cells (harness, model, directory) and how each cell's last run ended
    OUT/<harness>__<model>/      that cell's `orchard eval` output (config.json, trajectories, results...)

Cells run one after another, each with `parallel` agents at once. A cell whose run cannot start or breaks
(an unknown harness, a bundle that does not build, a configuration that differs from the one in its
directory) is recorded with its error in study.json and the next cell runs: one harness's failure does not
stop the matrix. Resuming is each cell's own: running the same study again into the same OUT skips the
cells' finished tasks and runs their errors again (orchard.eval.runner). `orchard report OUT` reads the
whole study."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchard.core.atomic_write import atomic_write_bytes
from orchard.core.errors import InvalidRequest, OrchardError, exception_text
from orchard.eval.results import EvalResults, read_results
from orchard.eval.run_config import read_model_file
from orchard.eval.suites import load_suite, select_tasks

log = logging.getLogger(__name__)

STUDY_FILE = "study.json"
CellStatus = Literal["pending", "finished", "errors", "failed"]


class StudyCell(BaseModel):
    harness: str
    model: str
    directory: str = Field(description="the cell's `orchard eval` output, relative to the study's directory")
    status: CellStatus = Field(default="pending", description=(
        "finished: every task has an agent outcome; errors: some rollouts ended in an error (run the study "
        "again to retry them); failed: the cell's run could not start or broke (see error)"))
    error: str | None = None


class Study(BaseModel):
    suite: str
    harnesses: list[str]
    models: list[str]
    cells: list[StudyCell]

    def cell(self, harness: str, model: str) -> StudyCell | None:
        return next((c for c in self.cells if (c.harness, c.model) == (harness, model)), None)


def cell_directory(harness: str, model: str) -> str:
    """`<harness>__<model>`, anything but letters, digits, '.', '_' and '-' as '_' (a model such as
    `openai/NAME` stays one directory)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{harness}__{model}")


def read_study(out_dir: Path) -> Study | None:
    return read_model_file(Path(out_dir) / STUDY_FILE, Study, "an Orchard study file")


def write_study(out_dir: Path, study: Study) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(out_dir) / STUDY_FILE, (json.dumps(study.model_dump(mode="json"), indent=2) + "\n").encode())


def plan_study(out_dir: Path, harnesses: list[str], models: list[str], suite: str) -> Study:
    """The study in `out_dir` with these cells added (a study run again with more harnesses or models grows;
    its earlier cells stay). Refused when the directory holds a study of another suite."""
    if not harnesses or not models:
        raise InvalidRequest("a study needs at least one harness and one model")
    previous = read_study(out_dir)
    suite_name = Path(suite).name
    if previous is not None and previous.suite != suite_name:
        raise InvalidRequest(f"{out_dir} holds a study of suite {previous.suite!r}, not {suite_name!r}; choose "
                             "another --out")
    study = previous or Study(suite=suite_name, harnesses=[], models=[], cells=[])
    study.harnesses = list(dict.fromkeys(study.harnesses + harnesses))
    study.models = list(dict.fromkeys(study.models + models))
    directories = {cell.directory: cell for cell in study.cells}
    for harness in harnesses:
        for model in models:
            if study.cell(harness, model) is not None:
                continue
            directory = cell_directory(harness, model)
            if directory in directories:
                other = directories[directory]
                raise InvalidRequest(f"harness {harness!r} × model {model!r} and {other.harness!r} × "
                                     f"{other.model!r} would share the directory {directory}; rename one")
            directories[directory] = StudyCell(harness=harness, model=model, directory=directory)
            study.cells.append(directories[directory])
    return study


async def run_study(*, harnesses: list[str], models: list[str], suite: str | Path, out_dir: str | Path,
                    run_cell: Callable[[StudyCell, Path], Any],
                    on_cell: Callable[[StudyCell, EvalResults | None], None] | None = None) -> Study:
    """Run every cell of the study (harness-major order) with `run_cell(cell, directory)`, an async function
    that evaluates the cell's harness and model on the suite into the directory — normally `run_eval` (see
    `eval_cell`). An exception from it (anything but a cancellation) fails that cell only; its message is kept
    in study.json. `on_cell` is told each cell's outcome as it ends."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidRequest(f"--out {out} is a file; give a directory (it is created if missing)")
    select_tasks(load_suite(suite), None)  # a suite that cannot run refuses the study, not each of its cells
    harnesses, models = list(dict.fromkeys(harnesses)), list(dict.fromkeys(models))
    study = plan_study(out, harnesses, models, str(suite))
    write_study(out, study)
    for harness in harnesses:
        for model in models:
            cell = study.cell(harness, model)
            assert cell is not None
            results: EvalResults | None = None
            try:
                results = await run_cell(cell, out / cell.directory)
            except Exception as exc:  # noqa: BLE001 — one cell's failure must not stop the matrix
                log.info("study cell %s × %s failed: %s", harness, model, exc)
                cell.status, cell.error = "failed", _error_text(exc)
            else:
                summary = results.summary
                cell.status = "errors" if summary.errors or summary.short or summary.pending else "finished"
                cell.error = None
            finally:
                write_study(out, study)
            if on_cell is not None:
                on_cell(cell, results)
    return study


def eval_cell(suite: str | Path, gateway_configs: Mapping[str, Any], **eval_options: Any
              ) -> Callable[[StudyCell, Path], Any]:
    """A `run_cell` that runs `run_eval` for the cell: the model's gateway config from `gateway_configs`
    (model name -> GatewayConfig), the rest (`parallel`, `task_ids`, `harness_options`, `timeouts`,
    `backend`, `orchard_url`, `orchard_client`, and `listener` — a callable (cell) -> EvalListener) the same
    for every cell."""
    from orchard.eval.runner import run_eval

    listener_for = eval_options.pop("listener", None)

    async def run(cell: StudyCell, directory: Path) -> EvalResults:
        return await run_eval(harness=cell.harness, model=cell.model, suite=suite, out_dir=directory,
                              gateway_config=gateway_configs[cell.model],
                              listener=listener_for(cell) if listener_for else None, **eval_options)

    return run


def study_run_directories(out_dir: Path) -> tuple[list[Path], list[StudyCell]]:
    """The directories of a study's cells that hold results, and the cells that hold none (with why)."""
    study = read_study(out_dir)
    if study is None:
        return [], []
    found, missing = [], []
    for cell in study.cells:
        directory = Path(out_dir) / cell.directory
        if read_results(directory) is not None:
            found.append(directory)
        else:
            missing.append(cell)
    return found, missing


def _error_text(exc: BaseException) -> str:
    text = exception_text(exc)
    return text if isinstance(exc, OrchardError) else f"{type(exc).__name__}: {text}"
