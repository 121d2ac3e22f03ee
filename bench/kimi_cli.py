"""Measurement: what running the real Kimi-CLI inside the sandbox costs.

- Per-rollout overhead: the same oracle task (swe-mini `orchard__pagekit-112`) with the `kimi-cli` harness
  (Kimi from its bundle, in the sandbox, through the gateway over the sandbox's loopback) and with the
  in-process `react` harness, one rollout per `orchard eval` run, alternating: the rollout's wall time
  (sandbox, agent, patch, grading), the agent phase alone, and the time from the agent phase's start to the
  first model call (the harness starting up).
- Start time: the rollouts' time from the agent phase's start to Kimi's first model call (config written,
  Kimi started, its agent, tools and system prompt loaded, the request sent) against the floor: the bundle's
  Python importing the modules a print run loads before that call (Kimi's CLI, app, print UI, soul, its
  OpenAI provider and the default agent's tool modules), in a sandbox with the bundle mounted. Target:
  ≤ 1.5× the floor. `import kimi_cli` alone loads only the package's nearly empty `__init__` (~50 ms), so
  it is shown beside `kimi --version` for scale, not as the floor."""

from __future__ import annotations

from bench.in_sandbox_harness import command_stats, overhead_rows, rollout_stats
from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio
from orchard.core.harness_bundle import get_bundle_spec

START_RATIO = 1.5
KIMI_MODULES = ("kimi_cli.cli", "kimi_cli.app", "kimi_cli.ui.print", "kimi_cli.soul.kimisoul",
                "kosong.contrib.chat_provider.openai_legacy",  # and the default agent's tools (its agent.yaml):
                *(f"kimi_cli.tools.{name}" for name in ("agent", "ask_user", "todo", "shell", "background", "file",
                                                        "web", "plan", "plan.enter")))
FLOOR = "python -c 'import <what a print run loads>'"


def run(ctx: BenchContext) -> Findings:
    stats = rollout_stats(ctx, "kimi-cli")  # the first rollout of each builds caches (bundle, agent bundle)
    spec = get_bundle_spec("kimi-cli")
    python = f"{spec.mount_point()}/venv/bin/python"
    stats.update(command_stats(ctx, "kimi-cli", {FLOOR: [python, "-c", "import " + ", ".join(KIMI_MODULES)],
                                                 "kimi --version": spec.entry_argv("--version"),
                                                 "python -c 'import kimi_cli'": [python, "-c", "import kimi_cli"]},
                               timeout=120))

    def p50(name: str) -> float:
        return stats[name].p50_ms

    rows = overhead_rows(stats, "kimi-cli")
    start, floor = p50("kimi-cli first_call"), p50(FLOOR)
    rows.append(Row(metric="kimi-cli start: agent start → first model call p50", unit="ms", ours=start,
                    peers={"floor: " + FLOOR: floor}, ratios={"start/floor": ratio(start, floor)},
                    targets=[Target(on="start/floor", op="<=", limit=START_RATIO)]))
    version, package = p50("kimi --version"), p50("python -c 'import kimi_cli'")
    rows.append(Row(metric="kimi --version p50", unit="ms", ours=version,
                    peers={"python -c 'import kimi_cli'": package}, ratios={"version/import": ratio(version, package)}))
    return Findings(rows=rows, latencies=stats, notes=[
        "Both harnesses play the same reference patch with the oracle (kimi-cli: 4 model calls — three Shell "
        "calls and the reply that ends its turn; react: 3). Each rollout is one `orchard eval` run on the "
        "embedded local backend; the wall time is the trial's (sandbox, agent, patch, grading).",
        "kimi-cli's agent phase holds writing its config, starting Kimi (CPython 3.13 from the bundle, its "
        "CLI, agent spec and tools), four model calls through the gateway over the sandbox's loopback, and "
        "reading its session logs back out of the sandbox.",
        "The start-time floor imports what Kimi needs before its first model call: "
        + ", ".join(f"`{m}`" for m in KIMI_MODULES) + ". `import kimi_cli` alone loads only the package's "
        "nearly empty `__init__`, which no run of Kimi could approach.",
    ])


MEASUREMENT = Measurement(
    name="kimi_cli",
    title="Kimi-CLI in the sandbox: per-rollout overhead and start time",
    method=("One swe-mini task (orchard__pagekit-112) with the oracle, `kimi-cli` and in-process `react` "
            "alternating, 5 rollouts each after one warm-up, one `orchard eval` run per rollout (local backend). "
            "The start time is the rollouts' agent start → first model call. Then, in one sandbox with the "
            "kimi-cli bundle mounted, the floor (the bundle's Python importing the modules a print run loads "
            "before its first call), `kimi --version` and `python -c 'import kimi_cli'`, alternating, 10 times "
            "each after 1 warm-up."),
    run=run,
)
