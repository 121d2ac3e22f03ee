"""What tells the cells of a report apart: a run's resolved configuration (orchard.eval.run_config, the run's
resume key) is its cell. Two runs are one cell only when every part of it is the same — the suite's content
(its hash, not its directory's name) and pass threshold, the harness with its version and options, the model
with its sampling settings, the trial timeouts — and then their rollouts of a task are attempts of that task.
This module gives the key and the short texts that name a cell's parts in tables (only what differs from the
defaults)."""

from __future__ import annotations

import json
from typing import Any

from orchard.core.harness import SamplingParams
from orchard.eval.run_config import EvalConfig, TrialTimeouts

HASH_CHARS = 12  # enough to tell suites apart at a glance; the full hash is in each run's config.json


def cell_key(config: EvalConfig) -> str:
    """The cell a run belongs to: its whole configuration, as canonical JSON."""
    return json.dumps(config.key(), sort_keys=True, separators=(",", ":"))


def suite_key(config: EvalConfig) -> tuple[str, str | None, float]:
    """A suite is its name, its content's hash and what passes on it: two directories of the same name are two
    suites, and so is one suite graded at two pass thresholds (its rates are not comparable)."""
    return config.suite, config.suite_hash, config.pass_threshold


def suite_text(config: EvalConfig) -> str:
    """`swe-mini (sha256 1a2b3c4d5e6f)`, the name alone when the run did not record a hash; `, pass ≥ 0.5` when
    the pass threshold is not 1."""
    parts = [f"sha256 {config.suite_hash[:HASH_CHARS]}"] if config.suite_hash is not None else []
    if config.pass_threshold != 1.0:
        parts.append(f"pass ≥ {config.pass_threshold:g}")
    return f"{config.suite} ({', '.join(parts)})" if parts else config.suite


def harness_options_text(config: EvalConfig) -> str:
    """The harness's options and the timeouts that differ from the defaults: `step_limit=5, agent_s=60`."""
    default_timeouts = TrialTimeouts().model_dump()
    timeouts = {name: value for name, value in config.timeouts.model_dump().items()
                if value != default_timeouts[name]}
    return _pairs({**config.harness_options, **timeouts})


def model_settings_text(config: EvalConfig) -> str:
    """The sampling settings that differ from the defaults: `temperature=0.2, seed=1`."""
    defaults = SamplingParams().model_dump()
    return _pairs({name: value for name, value in config.sampling.model_dump().items() if value != defaults[name]})


def harness_text(config: EvalConfig) -> str:
    """`react 0.3.0 (step_limit=5)`: the harness, its version and its options."""
    text = config.harness + (f" {config.harness_version}" if config.harness_version else "")
    options = harness_options_text(config)
    return f"{text} ({options})" if options else text


def model_text(config: EvalConfig) -> str:
    """`oracle (temperature=0.2)`: the model and its sampling settings."""
    settings = model_settings_text(config)
    return f"{config.model} ({settings})" if settings else config.model


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value if isinstance(value, str) else json.dumps(value, sort_keys=True)}"
                     for name, value in sorted(values.items()))
