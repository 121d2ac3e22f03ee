"""Kimi-CLI's config file: the gateway as its one OpenAI-compatible provider. Everything Kimi writes goes
under a share dir outside the task's workdir, so the patch never picks it up."""

from __future__ import annotations

import json

from orchard.core.harness import ModelConfig

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
