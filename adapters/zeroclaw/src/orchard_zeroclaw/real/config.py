"""ZeroClaw's config.toml for one run, written from its 0.8.4 schema (crates/zeroclaw-config/src/schema.rs):
one `custom` provider, `orchard`, whose `uri` is the rollout's gateway URL reached through the driver's
recording relay (`@RELAY_PORT@`, filled in by the driver) with the rollout's own key and the evaluator's model
name; one agent, `orchard`, with its risk profile (the autonomy level, file tools kept to the workspace, the
task's workdir allowed) and its runtime profile (the tool-iteration cap, the history cap with compact context,
the shell timeout, tools one at a time); the gateway on loopback without pairing; and the task's MCP servers.
Strings are JSON strings, which are TOML basic strings. Nothing here was checked against a binary: none can be
built on these machines (see README.md)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from orchard.core.errors import InvalidRequest
from orchard.core.harness import ModelConfig
from orchard.core.task import Task

AGENT = "orchard"
RELAY_PORT = "@RELAY_PORT@"


def relayed(base_url: str) -> tuple[str, str]:
    """(the upstream `scheme://host:port`, the URL ZeroClaw is given: the same path on the relay's port)."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise InvalidRequest(f"the real ZeroClaw reaches the model through the sandbox's gateway at a plain http URL; "
                             f"got {base_url!r} (run it through `orchard eval`, which gives one)")
    return f"http://{parts.hostname}:{parts.port or 80}", f"http://127.0.0.1:{RELAY_PORT}{parts.path}"


def config_toml(model: ModelConfig, task: Task, *, step_limit: int, max_history_messages: int,
                shell_timeout_s: float, autonomy: str) -> str:
    if not model.base_url or model.api_key is None:
        raise InvalidRequest("the real ZeroClaw runs inside the sandbox and needs the gateway's URL and key there; "
                             "run it through `orchard eval`, which gives them")
    q = json.dumps
    _, uri = relayed(model.base_url)
    lines = [
        "schema_version = 3",
        "",
        f"[providers.models.custom.{AGENT}]",
        f"uri = {q(uri)}",
        f"api_key = {q(model.api_key.get_secret_value())}",
        f"model = {q(model.model)}",
        "native_tools = true",
        'wire_api = "chat_completions"',
        "",
        f"[risk_profiles.{AGENT}]",
        f"level = {q(autonomy)}",
        "workspace_only = true",
        f"allowed_roots = {q([task.environment.workdir])}",
        "block_high_risk_commands = false",
        "require_approval_for_medium_risk = " + ("true" if autonomy == "supervised" else "false"),
        "",
        f"[runtime_profiles.{AGENT}]",
        "agentic = true",
        f"max_tool_iterations = {int(step_limit)}",
        f"max_history_messages = {int(max_history_messages)}",
        "compact_context = true",
        f"shell_timeout_secs = {max(1, round(shell_timeout_s))}",
        "parallel_tools = false",
        "",
        f"[agents.{AGENT}]",
        f"model_provider = {q('custom.' + AGENT)}",
        f"risk_profile = {q(AGENT)}",
        f"runtime_profile = {q(AGENT)}",
        "",
        "[gateway]",
        'host = "127.0.0.1"',
        "require_pairing = false",
        "session_persistence = false",
        "",
    ]
    servers = [(server.name, server.client_config()) for server in task.environment.mcp_servers]
    if servers:
        lines += ["[mcp]", "enabled = true", "deferred_loading = false", ""]
        for name, client in servers:
            lines += ["[[mcp.servers]]", f"name = {q(name)}", *_server(client), ""]
    return "\n".join(lines)


def _server(client: dict[str, Any]) -> list[str]:
    q = json.dumps
    if "url" in client:
        return ['transport = "http"', f"url = {q(client['url'])}"]
    lines = ['transport = "stdio"', f"command = {q(client['command'])}", f"args = {q(client['args'])}"]
    if client.get("env"):
        lines.append("env = { " + ", ".join(f"{q(k)} = {q(v)}" for k, v in client["env"].items()) + " }")
    return lines
