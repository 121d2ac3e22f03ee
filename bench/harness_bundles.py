"""Harness bundles: the build time of a small bundle cold (nothing downloaded yet), cold with the downloads
cached (what every rebuild and every new pin costs) and cached (already built), and what mounting one adds to
a local sandbox's create→ready (target: ≤ 10 ms p50 — a bind mount, not a copy)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from rich.progress import Progress

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from bench.stats import LatencyStats
from orchard.core.harness_bundle import HarnessBundleSpec, get_bundle_spec
from orchard.sandbox.client import Orchard
from orchard.sandbox.harness_bundles.build import ensure_bundle

NAME = "bench-tiny"
SPEC = HarnessBundleSpec(name=NAME, python="3.13", requirements=["tabulate==0.9.0"], entry=["tabulate"])
ADDED_P50_MS = 10.0
WITH, WITHOUT = "create→ready with a bundle", "create→ready without"


def _register(site: Path) -> None:
    """The bench's spec as a plug-in registers one: an entry point of a distribution on sys.path."""
    (site / "orchard_bench_bundle.py").write_text(
        "from orchard.core.harness_bundle import HarnessBundleSpec\n"
        f"SPEC = HarnessBundleSpec.model_validate_json({SPEC.model_dump_json()!r})\n")
    dist = site / "orchard_bench_bundle-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: orchard-bench-bundle\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[orchard.harness_bundles]\n{NAME} = orchard_bench_bundle:SPEC\n")
    sys.path.insert(0, str(site))


def _time_create(orchard: Orchard, **spec) -> float:
    started = time.perf_counter()
    sandbox = orchard.create(**spec)
    ready = time.perf_counter() - started
    try:
        if sandbox.exec("true").exit_code != 0:
            raise RuntimeError("a freshly created sandbox could not run `true`")
    finally:
        sandbox.close()
    return ready


def run(ctx: BenchContext) -> Findings:
    count, warmup = ctx.pick(30, 5), ctx.pick(3, 1)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-bundles-") as scratch:
        root = Path(scratch)
        (root / "site").mkdir()
        _register(root / "site")
        spec = get_bundle_spec(NAME)
        downloads = root / "downloads"
        started = time.perf_counter()
        ensure_bundle(spec, root / "cold", downloads=downloads)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        ensure_bundle(spec, root / "home" / "cache", downloads=downloads)
        warm_downloads = time.perf_counter() - started
        started = time.perf_counter()
        built = ensure_bundle(spec, root / "home" / "cache", downloads=downloads)
        cached = time.perf_counter() - started
        with_bundle, without = [], []
        with Orchard(home=root / "home") as orchard, Progress(console=ctx.console, transient=True) as progress:
            task = progress.add_task(f"create→ready with/without a bundle × {count}", total=warmup + count)
            for index in range(warmup + count):
                plain, mounted = _time_create(orchard), _time_create(orchard, bundles=[NAME])
                if index >= warmup:
                    without.append(plain)
                    with_bundle.append(mounted)
                progress.update(task, advance=1)
        sys.path.remove(str(root / "site"))
    stats = {WITH: LatencyStats.from_seconds(with_bundle), WITHOUT: LatencyStats.from_seconds(without)}
    on, off = stats[WITH], stats[WITHOUT]
    rows = [
        Row(metric="bundle build, cold (nothing downloaded)", unit="s", ours=round(cold, 2)),
        Row(metric="bundle build, downloads cached", unit="s", ours=round(warm_downloads, 2),
            ratios={"cached_downloads/cold": ratio(warm_downloads, cold)}),
        Row(metric="bundle build, already built", unit="ms", ours=round(cached * 1000, 3)),
        Row(metric="create→ready p50 with a bundle", unit="ms", ours=on.p50_ms, peers={WITHOUT: off.p50_ms},
            ratios={"with/without": ratio(on.p50_ms, off.p50_ms)}),
        Row(metric="create→ready p50 added by a bundle", unit="ms", ours=round(on.p50_ms - off.p50_ms, 2),
            targets=[Target(op="<=", limit=ADDED_P50_MS)]),
    ]
    return Findings(rows=rows, latencies=stats, notes=[
        f"The bundle: Debian trixie's Python {built.manifest.python_version} and `tabulate==0.9.0`, "
        f"{built.manifest.size_bytes / 1e6:.0f} MB. The big ones take longer to build in the pip step "
        "(kimi-cli: 355 MB, ~22 s with a warm Debian cache); mounting costs the same whatever the size.",
        "Cold: a fresh download directory (Debian's package lists and ~20 MB of .debs from deb.debian.org, the "
        "wheel from the package index). Downloads cached: a new cache directory, the same download directory "
        "(what a new pin or a rebuild costs).",
        "With and without a bundle alternate on the same embedded orchestrator (local backend): the bundle "
        "is a read-only bind on a 64 KiB tmpfs at /.orchard/harness.",
    ])


MEASUREMENT = Measurement(
    name="harness_bundles",
    title="Harness bundles: build and mount",
    method=("A small bundle (Python 3.13 + one pinned wheel) built once with nothing downloaded, once more into a "
            "new cache with the downloads kept, and asked for a third time once built. Then 30 local "
            "sandboxes after 3 warm-ups, one without and one with the bundle mounted in turn, each created, "
            "running `true` once and deleted."),
    run=run,
)
