"""Measurement: what running the OpenHands SDK inside the sandbox costs.

- Per-rollout overhead: the same oracle task (swe-mini `orchard__pagekit-112`) with the `openhands` harness
  (the SDK's agent from its bundle, in the sandbox, through the gateway over the sandbox's loopback) and with
  the in-process `react` harness, one rollout per `orchard eval` run, alternating: the rollout's wall time
  (sandbox, agent, patch, grading), the agent phase alone, and the time from the agent phase's start to the
  first model call (the harness starting up).
- Start time: the rollouts' time from the agent phase's start to the SDK's first model call (config written,
  the driver started, the SDK and its tools imported, the agent, its terminal and system prompt made, the
  request sent) against the floor `python -c 'import openhands.sdk'` run by the bundle's Python in a sandbox
  with the bundle mounted. Target: ≤ 1.5× the floor. Beside it, the bundle's Python importing what the
  driver imports before the conversation starts (the SDK and the default preset's tools), for scale."""

from __future__ import annotations

from bench.in_sandbox_harness import command_stats, overhead_rows, rollout_stats
from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from orchard.core.harness_bundle import get_bundle_spec

START_RATIO = 1.5
FLOOR = "python -c 'import openhands.sdk'"
DRIVER_IMPORTS = "python -c 'import <what the driver imports>'"
DRIVER_MODULES = ("litellm", "openhands.sdk", "openhands.tools.preset.default", "openhands.tools.terminal",
                  "openhands.tools.file_editor", "openhands.tools.task_tracker")


def run(ctx: BenchContext) -> Findings:
    stats = rollout_stats(ctx, "openhands")  # the first rollout of each builds caches (bundle, agent bundle)
    python = f"{get_bundle_spec('openhands').mount_point()}/venv/bin/python"
    stats.update(command_stats(ctx, "openhands", {FLOOR: [python, "-c", "import openhands.sdk"],
                                                  DRIVER_IMPORTS: [python, "-c", "import " + ", ".join(DRIVER_MODULES)]},
                               timeout=180))

    def p50(name: str) -> float:
        return stats[name].p50_ms

    rows = overhead_rows(stats, "openhands")
    start, floor, imports = p50("openhands first_call"), p50(FLOOR), p50(DRIVER_IMPORTS)
    rows.append(Row(metric="openhands start: agent start → first model call p50", unit="ms", ours=start,
                    peers={"floor: " + FLOOR: floor, DRIVER_IMPORTS: imports},
                    ratios={"start/floor": ratio(start, floor), "start/driver imports": ratio(start, imports)},
                    targets=[Target(on="start/floor", op="<=", limit=START_RATIO)]))
    return Findings(rows=rows, latencies=stats, notes=[
        "Both harnesses play the same reference patch with the oracle (3 model calls each: two `terminal` "
        "calls and `finish` for openhands; bash, bash, submit for react). Each rollout is one `orchard eval` "
        "run on the embedded local backend; the wall time is the trial's (sandbox, agent, patch, grading).",
        "openhands' agent phase holds writing its config, starting the driver (CPython 3.13 from the bundle, "
        "the SDK, litellm and the default tools), the agent's terminal session, three model calls through the "
        "gateway over the sandbox's loopback, closing the conversation and copying its events out.",
        "The driver imports " + ", ".join(f"`{m}`" for m in DRIVER_MODULES) + " before its first model "
        "call; `import openhands.sdk` alone already loads the SDK's LLM layer (litellm) and its agent.",
    ])


MEASUREMENT = Measurement(
    name="openhands",
    title="OpenHands SDK in the sandbox: per-rollout overhead and start time",
    method=("One swe-mini task (orchard__pagekit-112) with the oracle, `openhands` and in-process `react` "
            "alternating, 5 rollouts each after one warm-up, one `orchard eval` run per rollout (local backend). "
            "The start time is the rollouts' agent start → first model call. Then, in one sandbox with the "
            "openhands bundle mounted, the floor `python -c 'import openhands.sdk'` and the driver's imports, "
            "alternating, 10 times each after 1 warm-up."),
    run=run,
)
