"""Measurement: claw-bench's tasks played by their reference solutions (the oracle), end to end, in tasks per
minute: Orchard (`run_eval`, react + the oracle on the `claw-bench` suite read from the installed package:
each task in its own sandbox, setup.sh, the solution through the harness's shell tool, pytest in a fresh
grading sandbox, records) beside claw-bench's own runner on the same tasks, in the same run
(`claw_bench.core.runner.run_single_task`, what `claw-bench oracle` and `claw-bench run` call: the workspace
inside the task directory on the host, setup.sh, the adapter, pytest; no isolation).

claw-bench 0.1.0's own oracle adapter (DryRun) looks for solve.sh beside the workspace's parent, which its
runner's workspaces (`<task>/workspace/<run id>`) never have, so `claw-bench oracle` fails every task; the peer
here is its runner with that adapter pointed at the task's solve.sh (`SolveShAdapter`), nothing else changed.
The runner writes into the task directories, so it runs on a temporary copy of the installed tasks."""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bench.measurement import BenchContext, Measurement
from bench.orchard_clients import embedded_async_orchard
from bench.results_model import Findings, Row, Target, ratio
from orchard.core.task import Task
from orchard.core.task_suite import TaskSuite
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.eval.models import eval_gateway_config
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite, resolve_suite

PARALLEL = (1, 4)
SOLVE_TIMEOUT_S = 300


def pick_tasks(suite: TaskSuite, per_domain: int) -> TaskSuite:
    """The first `per_domain` runnable tasks of each domain, in the suite's order."""
    counts: dict[str, int] = {}
    tasks = []
    for task in suite.tasks:
        domain = task.metadata.get("claw_bench", {}).get("domain", "")
        if LOAD_ERROR_KEY not in task.metadata and counts.get(domain, 0) < per_domain:
            counts[domain] = counts.get(domain, 0) + 1
            tasks.append(task)
    return TaskSuite(name=suite.name, pass_threshold=suite.pass_threshold, tasks=tasks)


async def orchard_run(orchard, tasks: list[Task], parallel: int) -> tuple[float, int]:
    """(seconds, tasks resolved) of react + the oracle on the tasks, the whole run's wall time."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-claw-") as out:
        started = time.perf_counter()
        results = await run_eval(harness="react", model="oracle", suite=TaskSuite(name="claw-bench", tasks=tasks),
                                 out_dir=out, gateway_config=eval_gateway_config("oracle"), parallel=parallel,
                                 orchard_client=orchard)
        elapsed = time.perf_counter() - started
    if results.summary.errors:
        first = next(task for task in results.tasks if task.status == "error")
        raise RuntimeError(f"{results.summary.errors} task(s) failed to run; first: {first.error}")
    return elapsed, sum(1 for task in results.tasks if task.status == "resolved")


def solve_sh_adapter():
    """claw-bench's DryRun adapter (runs solve.sh with the workspace as $1), finding solve.sh in the task
    directory its runner's workspace (`<task>/workspace/<run id>`) is in."""
    from claw_bench.adapters.base import Response
    from claw_bench.adapters.dryrun import DryRunAdapter

    class SolveShAdapter(DryRunAdapter):
        def send_message(self, message: str, attachments: list | None = None) -> Response:
            started = time.monotonic()
            workspace = Path(self._extract_workspace(message))
            solve = workspace.parent.parent / "solution" / "solve.sh"
            ran = subprocess.run(["bash", str(solve), str(workspace)], capture_output=True, text=True,
                                 timeout=SOLVE_TIMEOUT_S)
            return Response(content=ran.stdout + ran.stderr, tokens_input=0, tokens_output=0,
                            duration_s=time.monotonic() - started)

    return SolveShAdapter()


@contextmanager
def tasks_copy() -> Iterator[Path]:
    """A temporary copy of the installed package's tasks directory (its runner writes workspaces into it), with
    Orchard's Python first on PATH, as the host image has it: the solutions call `python`."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-claw-tasks-") as tmp:
        root = Path(tmp) / "tasks"
        shutil.copytree(resolve_suite("claw-bench"), root, ignore=shutil.ignore_patterns("__pycache__", "workspace"))
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"
        try:
            yield root
        finally:
            os.environ["PATH"] = path


def package_run(root: Path, task_ids: list[str], parallel: int, run_id: str) -> tuple[float, int]:
    """(seconds, tasks passed) of claw-bench's runner with the solutions, `parallel` tasks at once (threads, as
    its `run --parallel` has them)."""
    from claw_bench.core.runner import run_single_task
    from claw_bench.core.task_loader import load_all_tasks

    configs, dirs = load_all_tasks(root, task_ids=task_ids)
    assert len(configs) == len(task_ids), f"claw-bench's loader found {len(configs)} of {len(task_ids)} tasks"

    def one(config):
        return run_single_task(config, dirs[config.id], solve_sh_adapter(), timeout=SOLVE_TIMEOUT_S,
                               run_id=run_id)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        results = list(pool.map(one, configs))
    return time.perf_counter() - started, sum(1 for result in results if result.passed)


async def measure(rounds: list[list[Task]]) -> dict[str, float]:
    """Each round's tasks run by Orchard and by claw-bench's runner, at each PARALLEL, the two alternating
    which goes first, so both meet the same load of the machine; the seconds and passes summed per runner."""
    totals: dict[str, float] = collections.defaultdict(float)
    async with embedded_async_orchard() as orchard:
        with tasks_copy() as root:
            # warm-up, not counted: imports, the sandbox agent's bundle, the first pytest
            await orchard_run(orchard, rounds[0][:1], 1)
            await asyncio.to_thread(package_run, root, [rounds[0][0].id], 1, "warmup")
            for index, tasks in enumerate(rounds):
                for parallel in PARALLEL:
                    ids = [task.id for task in tasks]
                    for name in ("orchard", "package") if index % 2 == 0 else ("package", "orchard"):
                        seconds, passed = await (
                            orchard_run(orchard, tasks, parallel) if name == "orchard"
                            else asyncio.to_thread(package_run, root, ids, parallel, f"p{parallel}"))
                        totals[f"{name} s p{parallel}"] += seconds
                        totals[f"{name} passed p{parallel}"] += passed
    return totals


def run(ctx: BenchContext) -> Findings:
    per_domain = ctx.pick(3, 1)
    chosen = pick_tasks(load_suite("claw-bench"), per_domain)
    ids = [task.id for task in chosen.tasks]
    rounds = [chosen.tasks[index::per_domain] for index in range(per_domain)]  # one task of each domain
    with ctx.console.status(f"claw-bench: {len(ids)} tasks, Orchard and claw-bench's runner in turn"):
        totals = asyncio.run(measure(rounds))
    figures = {f"{name} p{parallel}": len(ids) / totals[f"{name} s p{parallel}"] * 60
               for name in ("orchard", "package") for parallel in PARALLEL}
    rows = []
    for parallel in PARALLEL:
        ours, peer = figures[f"orchard p{parallel}"], figures[f"package p{parallel}"]
        rows.append(Row(metric=f"oracle tasks/min at {parallel} at once", unit="tasks/min", ours=ours,
                        peers={"claw-bench's runner": peer}, ratios={"orchard/claw-bench": ratio(ours, peer)}))
    rows.append(Row(metric=f"tasks passed with the solutions (of {len(ids)}, at 4 at once)", unit="tasks",
                    ours=totals["orchard passed p4"], peers={"claw-bench's runner": totals["package passed p4"]},
                    targets=[Target(op=">=", limit=len(ids))]))
    return Findings(rows=rows, notes=[
        f"Tasks: the first {per_domain} runnable of each of claw-bench 0.1.0's 14 domains, {len(ids)} in all "
        f"({', '.join(ids)}), the same for both, in {per_domain} round(s) of one task per domain: each round is "
        "run by both, at 1 and at 4 at once, the two taking turns to go first, so that both meet the same load "
        "on a shared machine. Tasks/min = tasks ÷ the summed wall time of the runs (Orchard's include starting "
        "each run's model gateway); one task of each is run first, not counted (imports, the sandbox agent's "
        "bundle).",
        "Orchard: `run_eval` (react + the oracle, `--parallel N`), each task in its own sandbox on the embedded "
        "local backend: setup.sh, the reference solution played as one shell command, then the verifier's pytest "
        "in a fresh grading sandbox, the trajectory and results written. claw-bench's runner: `run_single_task` "
        "in N threads on the host, no sandbox, the workspace inside a copy of the task directory.",
        ("claw-bench 0.1.0's own `claw-bench oracle` passes none of these: its DryRun adapter looks for solve.sh "
         "at <task>/workspace/solution/solve.sh; the peer's adapter runs <task>/solution/solve.sh, otherwise "
         "DryRun's. Its runner also misses what a verifier reads at <task>/workspace (xdom-013/014/015), which "
         "Orchard links to the workspace."),
        f"The machine's {os.cpu_count()} cores cap both at 4 at once; the load average above says what else ran.",
    ])


MEASUREMENT = Measurement(
    name="claw_bench",
    title="claw-bench oracle throughput: Orchard vs claw-bench's own runner",
    method=("The `claw-bench` suite (read from the installed PyPI package claw-bench 0.1.0): a few tasks of each "
            "domain run with their reference solutions, end to end, by `run_eval` with react and the oracle in "
            "sandboxes (1 and 4 at once), and by claw-bench's own runner (`run_single_task`, 1 and 4 threads) on "
            "the host, on the same tasks in one run, the two taking turns."),
    run=run,
)
