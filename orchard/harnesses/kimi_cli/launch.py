"""How Kimi-CLI is started inside the sandbox: its config file (the gateway as an OpenAI-compatible provider),
its environment and its command line. Everything it writes goes under a share dir outside the task's workdir,
so the patch never picks it up."""

from __future__ import annotations

import json

from orchard.core.harness import ModelConfig
from orchard.core.harness_bundle import HarnessBundleSpec

SHARE_DIR = "/tmp/.orchard-kimi"  # KIMI_SHARE_DIR: sessions, logs, config; outside every task's workdir
CONFIG_FILE = f"{SHARE_DIR}/config.toml"
MODEL_ALIAS = "orchard"  # the config's name for the one model it knows: the rollout's gateway route
PROVIDER_ALIAS = "orchard-gateway"
DEFAULT_CONTEXT_SIZE = 131_072


def config_toml(model: ModelConfig, *, max_context_size: int, max_steps: int) -> str:
    """Kimi's config.toml: one `openai_legacy` provider (plain /chat/completions) at the gateway, one model
    with the evaluator's model name, telemetry off. Strings are written as JSON strings (valid TOML basic
    strings)."""
    key = model.api_key.get_secret_value() if model.api_key is not None else "none"
    q = json.dumps
    return "\n".join([
        f"default_model = {q(MODEL_ALIAS)}",
        "default_thinking = false",
        "default_yolo = true",
        "telemetry = false",
        "",
        f"[providers.{q(PROVIDER_ALIAS)}]",
        'type = "openai_legacy"',
        f"base_url = {q(model.base_url)}",
        f"api_key = {q(key)}",
        "",
        f"[models.{q(MODEL_ALIAS)}]",
        f"provider = {q(PROVIDER_ALIAS)}",
        f"model = {q(model.model)}",
        f"max_context_size = {int(max_context_size)}",
        "",
        "[loop_control]",
        f"max_steps_per_turn = {int(max_steps)}",
        "max_retries_per_step = 1",
        "",
    ])


def environment(spec: HarnessBundleSpec) -> dict[str, str]:
    """The environment Kimi runs with: its bundle's (telemetry and auto-update off), its share dir, the
    bundle's `bin/` (ripgrep, for its Grep tool), which `command` puts first on the task's own PATH."""
    return {**spec.entry_env(), "KIMI_SHARE_DIR": SHARE_DIR, "ORCHARD_KIMI_BIN": f"{spec.mount_point()}/bin",
            "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200"}


def command(spec: HarnessBundleSpec, workdir: str) -> list[str]:
    """`kimi --print --output-format stream-json`, auto-approving, in `workdir`. The prompt goes in on stdin
    (print mode reads it there when there is no `--prompt`), so no argument length limit applies to it."""
    kimi = spec.entry_argv("--print", "--output-format", "stream-json", "--yolo", "--afk",
                           "--config-file", CONFIG_FILE, "--model", MODEL_ALIAS, "--work-dir", workdir)
    return ["sh", "-c", 'PATH="$ORCHARD_KIMI_BIN:$PATH" exec "$@"', "kimi", *kimi]
