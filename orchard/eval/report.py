"""The HTML report over evaluation runs (`orchard report DIR... --out report.html`): per suite a harness ×
model matrix of resolve rates (colored cells), a summary of each run, and each task's trajectory to expand
(steps, tool calls, observations, errors, the patch and the test outcomes).

One self-contained file: styles inline, no scripts or fonts fetched, every value HTML-escaped (jinja2
autoescaping); long texts are cut to `MAX_TEXT_CHARS` so a report of long runs stays openable."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.trajectory import Content, Trajectory
from orchard.eval.results import RESULTS_FILE, EvalResults, TaskResult, latest_by_task, read_results, read_trajectories
from orchard.util.files import atomic_write_text

TEMPLATE = "report.html.jinja"
MAX_TEXT_CHARS = 20_000


@dataclass
class RunReport:
    directory: Path
    results: EvalResults
    trajectories: dict[str, Trajectory] = field(default_factory=dict)  # each task's latest rollout


@dataclass
class MatrixCell:
    rate: float | None
    resolved: int
    finished: int
    errors: int
    anchor: str

    @property
    def color(self) -> str:
        """Red (0 %) through yellow to green (100 %); grey when nothing finished."""
        if self.rate is None:
            return "#e5e7eb"
        return f"hsl({self.rate * 120:.0f}, 70%, 78%)"


@dataclass
class SuiteMatrix:
    suite: str
    harnesses: list[str]
    models: list[str]
    cells: dict[tuple[str, str], MatrixCell]


def load_runs(directories: list[Path]) -> list[RunReport]:
    if not directories:
        raise InvalidRequest("name at least one run directory (an `orchard eval --out` directory)")
    runs = []
    for directory in directories:
        results = read_results(Path(directory))
        if results is None:
            raise NotFound(f"{directory} has no {RESULTS_FILE}: is it the --out directory of an `orchard eval` run?")
        latest = {task_id: trajectory for task_id, (trajectory, _) in latest_by_task(read_trajectories(directory)).items()}
        runs.append(RunReport(Path(directory), results, latest))
    return runs


def build_matrices(runs: list[RunReport]) -> list[SuiteMatrix]:
    """One matrix per suite; when several runs share a cell (same harness, model and suite) their tasks are
    counted together."""
    matrices = []
    for suite in dict.fromkeys(run.results.settings.suite for run in runs):
        members = [run for run in runs if run.results.settings.suite == suite]
        harnesses = list(dict.fromkeys(run.results.settings.harness for run in members))
        models = list(dict.fromkeys(run.results.settings.model for run in members))
        cells = {}
        for harness in harnesses:
            for model in models:
                same = [run for run in members
                        if (run.results.settings.harness, run.results.settings.model) == (harness, model)]
                if not same:
                    continue
                resolved = sum(run.results.summary.resolved for run in same)
                finished = sum(run.results.summary.finished for run in same)
                cells[(harness, model)] = MatrixCell(
                    rate=resolved / finished if finished else None, resolved=resolved, finished=finished,
                    errors=sum(run.results.summary.errors for run in same), anchor=run_anchor(runs.index(same[0])))
        matrices.append(SuiteMatrix(suite, harnesses, models, cells))
    return matrices


def run_anchor(index: int) -> str:
    return f"run-{index + 1}"


def render_report(runs: list[RunReport]) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     lstrip_blocks=True)
    environment.filters.update(content_text=content_text, clip=clip, as_json=as_json, seconds=seconds)
    template = environment.from_string(files("orchard.eval").joinpath(TEMPLATE).read_text(encoding="utf-8"))
    return template.render(runs=runs, matrices=build_matrices(runs), run_anchor=run_anchor,
                           task_row=_task_row)


def write_report(runs: list[RunReport], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_report(runs))  # a reader never sees half a report
    return path


def _task_row(run: RunReport, result: TaskResult) -> dict[str, Any]:
    trajectory = run.trajectories.get(result.task_id)
    outcome = trajectory.outcome if trajectory is not None else None
    return {"result": result, "trajectory": trajectory, "details": outcome.details if outcome else {}}


# --- filters ---------------------------------------------------------------------------------------

def content_text(content: Content | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text if part.type == "text" else f"[image: {part.source.path}]" for part in content)


def clip(text: Any, limit: int = MAX_TEXT_CHARS) -> str:
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… [{len(text) - limit:,} more characters not shown]"


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def seconds(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"
