"""The bench's own machinery, kept from rotting: a real floor server (a child process) timed through the
interleaved harness, the percentile maths, targets and ratios, the JSON round trip and the Markdown
report. SWE-ReX and sandboxes are left to `make bench`; this stays well under 5 s."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from rich.console import Console

from bench.latency import async_block, measure_interleaved, sync_block
from bench.machine import collect_machine_info
from bench.markdown import render_markdown, write_markdown
from bench.memory import host_process
from bench.peers.floor import AsyncFloorClient, FloorClient, floor_server
from bench.results_model import (BenchResults, MeasurementResult, Row, Target, format_figure, load_results,
                                 ratio, save_results)
from bench.stats import LatencyStats, percentile


def test_percentile_interpolates_like_numpy_linear():
    samples = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(samples, 50) == pytest.approx(50.5)
    assert percentile(samples, 99) == pytest.approx(99.01)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    stats = LatencyStats.from_seconds([0.001, 0.002, 0.003])
    assert (stats.n, stats.p50_ms, stats.min_ms, stats.max_ms) == (3, pytest.approx(2.0), pytest.approx(1.0),
                                                                   pytest.approx(3.0))


def test_targets_check_our_value_and_named_ratios():
    row = Row(metric="exec p50", unit="ms", ours=2.0, peers={"floor": 1.6},
              ratios={"orchard/floor": ratio(2.0, 1.6)},
              targets=[Target(op="<=", limit=2.5), Target(on="orchard/floor", op="<=", limit=1.5)])
    assert row.passed is True
    assert row.target_text() == "≤ 2.50 ms; orchard/floor ≤ 1.50×"
    slower = row.model_copy(update={"ratios": {"orchard/floor": 1.6}})
    assert slower.passed is False
    assert Row(metric="info", unit="ms", ours=1.0).passed is None
    assert [format_figure(v) for v in (2.5, 12.34, 126.6, 2480.0, 0.0)] == ["2.50", "12.3", "127", "2,480", "0"]


def test_floor_server_round_trips_through_the_harness_and_the_report(tmp_path):
    with floor_server() as server:
        pid = server.pid
        assert httpx.get(server.url + "/health").json() == {"status": "ok", "pid": pid}
        with FloorClient(server.url) as floor:
            assert floor.exec("echo hi")["stdout"] == "hi\n"
            assert floor.exec(["sh", "-c", "exit 0"])["exit_code"] == 0
            with pytest.raises(RuntimeError, match="floor exec failed"):
                floor.exec("exit 3")
            bad = httpx.post(server.url + "/exec", content=b"not json")
            assert bad.status_code == 400 and bad.json()["error"] == "invalid_request"

            with asyncio.Runner() as runner:
                async_floor = AsyncFloorClient(server.url, max_connections=2)
                try:
                    stats = measure_interleaved(
                        {"floor sync": sync_block(lambda: floor.exec("true")),
                         "floor async": async_block(runner, lambda: async_floor.exec("true"))},
                        warmup=2, runs=12, rounds=3)
                finally:
                    runner.run(async_floor.__aexit__(None, None, None))
        server_rss_mb = host_process(pid).rss_mb()
    # Leaving the block stopped the server's whole process group.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    assert set(stats) == {"floor sync", "floor async"}
    sync, asynchronous = stats["floor sync"], stats["floor async"]
    assert sync.n == asynchronous.n == 12
    # Loopback HTTP plus fork/exec of `true`: real work, but nowhere near a second.
    assert 0.05 < sync.p50_ms <= sync.p99_ms < 1000
    assert 1 < server_rss_mb < 200

    row = Row(metric="exec p50", unit="ms", ours=sync.p50_ms, peers={"floor async": asynchronous.p50_ms},
              ratios={"sync/async": ratio(sync.p50_ms, asynchronous.p50_ms)},
              targets=[Target(op="<=", limit=1000.0)])
    result = MeasurementResult(name="smoke", title="Smoke", method="Floor only.", rows=[row], latencies=stats,
                               notes=["a note"], quick=True, measured_at="2025-01-01 00:00 UTC",
                               duration_s=0.5, machine=collect_machine_info(), load_average_1m=0.5)
    json_path, doc_path = tmp_path / "results" / "latest.json", tmp_path / "BENCHMARKS.md"
    save_results(json_path, BenchResults(measurements={"smoke": result}))
    assert not list(json_path.parent.glob("*.tmp"))
    reloaded = load_results(json_path)
    assert reloaded.measurements["smoke"].rows[0].ours == pytest.approx(sync.p50_ms)

    write_markdown(doc_path, reloaded, ["smoke", "never_run"])
    doc = doc_path.read_text()
    assert "## 1. Smoke (`smoke`)" in doc and "never_run" not in doc
    assert f"| exec p50 | {format_figure(sync.p50_ms)} ms |" in doc
    assert "✅ pass" in doc and "| floor sync | 12 |" in doc and "- a note" in doc
    assert "1 / 1 ✅" in doc and "quick (smoke) run" in doc
    assert "No measurement has been run yet." in render_markdown(BenchResults(), ["smoke"])


def test_load_results_starts_fresh_on_missing_or_foreign_files(tmp_path):
    assert load_results(tmp_path / "absent.json").measurements == {}
    foreign = tmp_path / "old.json"
    foreign.write_text('{"measurements": {"x": {"name": 1}}}')
    assert load_results(foreign).measurements == {}


def test_console_report_prints_rows(tmp_path):
    from bench.console_report import print_measurement

    console = Console(record=True, width=160)
    result = MeasurementResult(
        name="smoke", title="Smoke", method="m", quick=False, measured_at="2025-01-01 00:00 UTC",
        duration_s=1.0, machine=collect_machine_info(), load_average_1m=0.5,
        rows=[Row(metric="throughput", unit="MB/s", ours=150.0, targets=[Target(op=">=", limit=200.0)])])
    print_measurement(console, result)
    text = console.export_text()
    assert "throughput" in text and "150 MB/s" in text and "miss" in text


async def test_load_harness_counts_every_failure_against_a_real_floor_server():
    from bench.many_sandboxes import run_load

    with floor_server() as server:
        async with AsyncFloorClient(server.url, max_connections=4) as floor:
            async def call(index: int) -> int | None:
                # Every fifth command exits 1, which the floor client turns into an error.
                return (await floor.exec("true" if index % 5 else "false"))["exit_code"]

            ticks = []
            outcome = await run_load(call, total=20, concurrency=4, deadline_s=60, on_done=lambda: ticks.append(1))
    assert (outcome.done, outcome.failures, len(outcome.latencies), len(ticks)) == (20, 4, 16, 20)
    assert "floor exec failed" in outcome.first_failure
    assert outcome.wall_s > 0


def test_cli_refuses_an_unknown_measurement_name():
    from typer.testing import CliRunner

    from bench.run import MEASUREMENTS, app

    result = CliRunner().invoke(app, ["--only", "no_such_thing"])
    assert result.exit_code == 2
    assert "no_such_thing" in result.output and "exec_latency" in result.output
    assert set(MEASUREMENTS) == {"exec_latency", "create_ready", "transfer", "many_sandboxes", "agent_rss",
                                 "eval_throughput", "k8s", "docker", "embedded_generation", "rl_wasted_rollouts",
                                 "rl_step_time", "sft_throughput", "model_network",
                                 "oci_import", "harness_bundles", "parallel_harnesses", "kimi_cli",
                                 "openhands", "pools", "caps", "ports", "services", "claw_bench",
                                 "claw_mini"}


def test_bubblewrap_alone_runs_true_with_a_sandboxs_arguments(tmp_path):
    """The create→ready peer: real bwrap, the default sandbox's arguments, `true` inside; it must succeed
    (a failing bwrap raises) and leave nothing of its temporary sandbox directory."""
    import tempfile

    from bench.peers.bwrap_alone import time_bwrap_true
    from orchard.sandbox.bundle import ensure_agent_bundle

    before = set(os.listdir(tempfile.gettempdir()))
    assert time_bwrap_true(ensure_agent_bundle(tmp_path / "cache")) > 0
    assert not {name for name in set(os.listdir(tempfile.gettempdir())) - before
                if name.startswith("orchard-bench-bwrap-")}
