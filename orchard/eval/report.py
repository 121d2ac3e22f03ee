"""The HTML report over evaluation runs (`orchard report DIR... --out report.html`): per suite (its content) a
harness × model matrix of resolve rates, a cell per configuration (orchard.eval.cells; colored, each with its
Wilson interval) and the same cells as rows (tasks, attempts; steps, tokens and wall time per attempt,
errors apart), pass@k and pass^k per cell and per task, a summary of each run with its options, and each
task's trajectory to
expand (steps, tool calls, observations, errors, the patch and the test outcomes). A study's directory
(`orchard study --out`) stands for all of its cells.

One self-contained file: styles inline, no scripts or fonts fetched, every value HTML-escaped (jinja2
autoescaping); long texts are cut to `MAX_TEXT_CHARS` so a report of long runs stays openable."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from orchard.core.atomic_write import atomic_write_text
from orchard.core.errors import InvalidRequest, NotFound
from orchard.core.trajectory import Content, Trajectory
from orchard.eval.cells import harness_options_text, model_settings_text, suite_key, suite_text
from orchard.eval.domains import DomainRow, domain_rows
from orchard.eval.estimators import Interval
from orchard.eval.matrix import RESAMPLES, SEED, MatrixRow, matrix_rows
from orchard.eval.results import RESULTS_FILE, EvalResults, TaskResult, latest_by_task, read_results, read_trajectories
from orchard.eval.summary import startup_text, versus_text
from orchard.eval.study import STUDY_FILE, StudyCell, study_run_directories

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
    attempts: int
    finished: int
    errors: int
    anchor: str
    row: MatrixRow | None = None

    @property
    def color(self) -> str:
        return rate_color(self.rate)


def rate_color(rate: float | None) -> str:
    """Red (0 %) through yellow to green (100 %); grey when nothing finished."""
    if rate is None:
        return "#e5e7eb"
    return f"hsl({rate * 120:.0f}, 70%, 78%)"


@dataclass
class SuiteMatrix:
    """One suite's matrix: a row per harness configuration (harness, version, options, timeouts), a column
    per model configuration (model, sampling settings), `cells` keyed by (row, column) index."""

    suite: str
    harnesses: list[str]
    models: list[str]
    cells: dict[tuple[int, int], MatrixCell]
    rows: list[MatrixRow] = field(default_factory=list)
    suite_hash: str | None = None


def load_runs(directories: list[Path]) -> list[RunReport]:
    """The runs in `directories`: `orchard eval --out` directories, or `orchard study --out` directories
    (their cells that hold results)."""
    if not directories:
        raise InvalidRequest("name at least one run directory (an `orchard eval --out` directory)")
    runs = []
    for directory in _run_directories(directories):
        results = read_results(Path(directory))
        if results is None:
            raise NotFound(f"{directory} has no {RESULTS_FILE}: is it the --out directory of an `orchard eval` run "
                           f"or of an `orchard study`?")
        latest = {task_id: trajectory for task_id, (trajectory, _) in latest_by_task(read_trajectories(directory)).items()}
        runs.append(RunReport(Path(directory), results, latest))
    return runs


def unrun_cells(directories: list[Path]) -> list[StudyCell]:
    """The cells of the studies among `directories` that hold no results (their run could not start)."""
    return [cell for directory in directories if not (Path(directory) / RESULTS_FILE).exists()
            for cell in study_run_directories(Path(directory))[1]]


def _run_directories(directories: list[Path]) -> list[Path]:
    expanded: list[Path] = []
    for directory in directories:
        directory = Path(directory)
        if not (directory / RESULTS_FILE).exists() and (directory / STUDY_FILE).exists():
            expanded.extend(study_run_directories(directory)[0])
        else:
            expanded.append(directory)
    return expanded


def build_matrices(runs: list[RunReport]) -> list[SuiteMatrix]:
    """One matrix per suite (its name and content hash: two suites that share a directory name are two); a
    cell per configuration, the runs of one configuration together, a task's rollouts its attempts
    (orchard.eval.matrix: the rate over tasks, its bootstrap interval, means per attempt)."""
    rows = matrix_rows([run.results for run in runs])
    suites = list(dict.fromkeys(suite_key(row.config) for row in rows))
    names = [suite[0] for suite in suites]
    matrices = []
    for suite in suites:
        members = [row for row in rows if suite_key(row.config) == suite]
        harnesses = list(dict.fromkeys(_harness_part(row) for row in members))
        models = list(dict.fromkeys(_model_part(row) for row in members))
        cells = {(harnesses.index(_harness_part(row)), models.index(_model_part(row))): MatrixCell(
            rate=row.resolve_rate, resolved=row.resolved, attempts=row.attempts, finished=row.finished,
            errors=row.errors, anchor=run_anchor(row.runs[0]), row=row) for row in members}
        first_of = {part: next(row for row in members if _harness_part(row) == part) for part in harnesses}
        model_of = {part: next(row for row in members if _model_part(row) == part) for part in models}
        # the hash in the title only where a name alone would not tell the suites apart
        threshold = f" (pass ≥ {suite[2]:g})" if suite[2] != 1.0 else ""
        title = members[0].suite_text if names.count(suite[0]) > 1 else suite[0] + threshold
        matrices.append(SuiteMatrix(title, [first_of[part].harness_text for part in harnesses],
                                    [model_of[part].model_text for part in models], cells, members, suite[1]))
    return matrices


@dataclass
class DomainMatrix:
    """One domain's harness × model matrix (orchard.eval.domains): `cells` keyed by (harness, model) index."""

    domain: str
    harnesses: list[str]
    models: list[str]
    cells: dict[tuple[int, int], DomainRow]
    k: int = 1


def domain_matrices(runs: list[RunReport]) -> list[DomainMatrix]:
    """A harness × model matrix per domain, each cell a domain's tasks pooled over the suites run."""
    rows = domain_rows([run.results for run in runs])
    matrices = []
    for domain in dict.fromkeys(row.domain for row in rows):
        members = [row for row in rows if row.domain == domain]
        harnesses = list(dict.fromkeys(row.harness for row in members))
        models = list(dict.fromkeys(row.model for row in members))
        cells = {(harnesses.index(row.harness), models.index(row.model)): row for row in members}
        matrices.append(DomainMatrix(domain, harnesses, models, cells, max(row.k for row in members)))
    return matrices


def _harness_part(row: MatrixRow) -> str:
    config = row.config
    return json.dumps([config.harness, config.harness_version, config.harness_options,
                       config.timeouts.model_dump()], sort_keys=True)


def _model_part(row: MatrixRow) -> str:
    return json.dumps([row.config.model, row.config.sampling.model_dump()], sort_keys=True)


def run_anchor(index: int) -> str:
    return f"run-{index + 1}"


def render_report(runs: list[RunReport], unrun: list[StudyCell] | None = None) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     lstrip_blocks=True)
    environment.filters.update(content_text=content_text, clip=clip, as_json=as_json, seconds=seconds,
                               percent=percent, interval=interval_text, number=number, versus=versus_text,
                               startup=startup_filter, pass_at=pass_at, pass_hat=pass_hat, reward=reward_text,
                               rate_color=rate_color)
    environment.globals.update(harness_options=_options_of(harness_options_text),
                               model_settings=_options_of(model_settings_text), suite_name=_of(suite_text))
    template = environment.from_string(files("orchard.eval").joinpath(TEMPLATE).read_text(encoding="utf-8"))
    return template.render(runs=runs, matrices=build_matrices(runs), domains=domain_matrices(runs),
                           run_anchor=run_anchor,
                           task_row=_task_row, unrun=unrun or [], resamples=RESAMPLES, seed=SEED)


def write_report(runs: list[RunReport], path: str | Path, unrun: list[StudyCell] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_report(runs, unrun))  # a reader never sees half a report
    return path


def _of(text):
    return lambda results: text(results.settings.config())


def _options_of(text):
    return lambda results: text(results.settings.config()) or "-"


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


def startup_filter(value: Any) -> str:
    """A start by stage (a StartupTimings, or the summary's medians) as one line; "-" when unknown."""
    if value is None or value == {}:
        return "-"
    return startup_text(value if isinstance(value, dict) else value.model_dump(exclude_none=True))


def seconds(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def interval_text(value: Interval | None) -> str:
    return "-" if value is None else f"{value.low:.0%}–{value.high:.0%}"


def pass_at(row: MatrixRow, k: int) -> str:
    return _pass_text(row, k, "pass_at_k")


def pass_hat(row: MatrixRow, k: int) -> str:
    return _pass_text(row, k, "pass_hat_k")


def _pass_text(row: MatrixRow, k: int, field: str) -> str:
    """The cell's mean at k; `n/a (2 short)` where tasks lack attempts; `-` past the cell's own K."""
    if k > len(row.pass_k):
        return "-"
    entry = row.pass_k[k - 1]
    value = getattr(entry, field)
    return percent(value) if value is not None else f"n/a ({entry.short} short)"


def reward_text(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
