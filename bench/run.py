"""`make bench`: run the measurements, print each beside its peers, keep the figures in
`bench/results/latest.json` and render them into `docs/BENCHMARKS.md`.

    python -m bench.run                      # everything
    python -m bench.run --quick              # smoke run: small sizes, own JSON file, doc untouched
    python -m bench.run --only exec_latency  # one measurement (repeatable); the others keep their figures
"""

from __future__ import annotations

import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from bench import agent_rss, create_ready, docker, eval_throughput, exec_latency, k8s, many_sandboxes, transfer
from bench import embedded_generation, harness_bundles, model_network, oci_import, parallel_harnesses
from bench import sft_throughput
from bench import kimi_cli
from bench import openhands
from bench import caps, pools, ports, services
from bench import claw_bench
from bench import claw_mini
from bench import rl_step_time, rl_wasted_rollouts
from bench.console_report import print_measurement
from bench.machine import collect_machine_info, load_average_1m
from bench.markdown import write_markdown
from bench.measurement import BenchContext, Measurement
from bench.results_model import MeasurementResult, load_results, save_results

MEASUREMENTS: dict[str, Measurement] = {m.name: m for m in (
    exec_latency.MEASUREMENT, create_ready.MEASUREMENT, transfer.MEASUREMENT,
    many_sandboxes.MEASUREMENT, agent_rss.MEASUREMENT, eval_throughput.MEASUREMENT, k8s.MEASUREMENT,
    docker.MEASUREMENT, model_network.MEASUREMENT, harness_bundles.MEASUREMENT, oci_import.MEASUREMENT,
    embedded_generation.MEASUREMENT, rl_wasted_rollouts.MEASUREMENT, rl_step_time.MEASUREMENT,
    sft_throughput.MEASUREMENT, parallel_harnesses.MEASUREMENT, kimi_cli.MEASUREMENT,
    openhands.MEASUREMENT, pools.MEASUREMENT, caps.MEASUREMENT, ports.MEASUREMENT,
    services.MEASUREMENT, claw_bench.MEASUREMENT, claw_mini.MEASUREMENT)}

_BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_JSON = _BENCH_DIR / "results" / "latest.json"
QUICK_JSON = _BENCH_DIR / "results" / "quick.json"
DEFAULT_DOC = _BENCH_DIR.parent / "docs" / "BENCHMARKS.md"

app = typer.Typer(add_completion=False)


def run_measurement(measurement: Measurement, ctx: BenchContext, machine) -> MeasurementResult:
    measured_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = load_average_1m()
    started = time.perf_counter()
    findings = measurement.run(ctx)
    return MeasurementResult(name=measurement.name, title=measurement.title, method=measurement.method,
                             quick=ctx.quick, measured_at=measured_at,
                             duration_s=time.perf_counter() - started, machine=machine,
                             load_average_1m=load,
                             **findings.model_dump())


@app.command()
def main(
    quick: bool = typer.Option(False, "--quick", help="Small sizes, for a smoke test. Writes "
                               "bench/results/quick.json and leaves docs/BENCHMARKS.md alone."),
    only: Optional[list[str]] = typer.Option(None, "--only", help=f"Run only this measurement (repeatable): "
                                             f"{', '.join(MEASUREMENTS)}."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Where to keep the results."),
    doc_path: Optional[Path] = typer.Option(None, "--doc", help="Where to render the Markdown report."),
) -> None:
    console = Console()
    if not console.is_terminal:  # piped or logged: wide enough that the tables keep one line per figure
        console = Console(width=180)
    unknown = [name for name in only or [] if name not in MEASUREMENTS]
    if unknown:
        raise typer.BadParameter(f"no measurement named {', '.join(unknown)}; choose from "
                                 f"{', '.join(MEASUREMENTS)}", param_hint="--only")
    selected = [MEASUREMENTS[name] for name in (only or MEASUREMENTS)]
    json_path = json_path or (QUICK_JSON if quick else DEFAULT_JSON)
    doc_path = doc_path or (None if quick else DEFAULT_DOC)

    ctx = BenchContext(quick=quick, console=console)
    machine = collect_machine_info()
    console.print(f"[bold]Orchard Env bench[/] on {machine.summary()}{' — quick' if quick else ''}")
    results = load_results(json_path)
    failed: list[str] = []
    try:
        for measurement in selected:
            console.rule(measurement.title)
            try:
                result = run_measurement(measurement, ctx, machine)
            except Exception:  # one broken measurement must not lose the others' figures
                console.print(f"[red]{measurement.name} failed:[/]\n{traceback.format_exc()}")
                failed.append(measurement.name)
                continue
            print_measurement(console, result)
            results.measurements[measurement.name] = result
            save_results(json_path, results)
            if doc_path is not None:
                write_markdown(doc_path, results, list(MEASUREMENTS))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: peers and sandboxes were stopped; finished measurements "
                      f"are kept in {json_path.name}[/]")
        raise typer.Exit(130)
    console.print(f"results: {json_path}" + (f", report: {doc_path}" if doc_path else ""))
    if failed:
        console.print(f"[red]failed measurements: {', '.join(failed)}[/]")
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
