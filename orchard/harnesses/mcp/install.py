"""What every sandbox of a task with MCP servers gets (docs/tools-mcp.md): the servers' client config in
the `mcpServers` shape at MCP_CONFIG_PATH (what kimi-cli, OpenHands and most MCP clients read; a `cli`
harness program is pointed at it by ORCHARD_MCP_CONFIG) and the `mcp-call` command at MCP_CALL_PATH (it
runs on the image's python3), placed in the environment phase. A harness whose only tool is a shell
(mini-swe-agent) adds `mcp_call_note` to the task's instruction: how to call a tool, every tool listed, so
the model needs no step to discover them."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import Sandbox
from orchard.core.task import MCP_CALL_PATH, MCP_DIR, Task

MCP_CONFIG_PATH = f"{MCP_DIR}/servers.json"
MCP_SERVERS_ENV = "ORCHARD_MCP_SERVERS"  # the servers as JSON (mcp-call reads it)
MCP_CONFIG_ENV = "ORCHARD_MCP_CONFIG"  # the config file's path
LIST_TIMEOUT_S = 120
NOTE = """

This task also gives you tools over MCP. Call one from the shell with:
    {path} SERVER TOOL '<arguments as a JSON object>'
(`{path} --list` lists them again). The tools (server, tool: description; then its arguments' JSON Schema):
{tools}"""


class McpToolsUnavailable(InvalidRequest):
    """The task's MCP tools cannot be reached from the sandbox's shell: the task's environment is at fault."""


def mcp_servers(task: Task) -> dict[str, Any]:
    return {server.name: server.client_config() for server in task.environment.mcp_servers}


def mcp_env(task: Task) -> dict[str, str]:
    """The sandbox's environment for a task with MCP servers (none without)."""
    if not task.environment.mcp_servers:
        return {}
    return {MCP_SERVERS_ENV: json.dumps(mcp_servers(task)), MCP_CONFIG_ENV: MCP_CONFIG_PATH}


async def place_mcp_files(sandbox: Sandbox, task: Task) -> None:
    """The config file and mcp-call, in the environment phase (nothing for a task without MCP servers)."""
    if not task.environment.mcp_servers:
        return
    await sandbox.write_file(MCP_CONFIG_PATH, json.dumps({"mcpServers": mcp_servers(task)}, indent=2) + "\n")
    script = resources.files("orchard.harnesses.mcp").joinpath("mcp_call.py").read_text()
    await sandbox.write_file(MCP_CALL_PATH, script, mode=0o755)


async def mcp_call_note(sandbox: Sandbox, task: Task) -> str:
    """For a shell-only harness: the note to add to the task's instruction ("" without MCP servers)."""
    if not task.environment.mcp_servers:
        return ""
    probe = await sandbox.exec(["/bin/sh", "-c", "command -v python3"], timeout=30)
    if probe.exit_code != 0:
        raise McpToolsUnavailable(f"task {task.id}: its MCP tools reach a shell-only harness through mcp-call, which "
                             f"needs python3 in the sandbox's image ({task.environment.image}); it has none")
    listing = await sandbox.exec([MCP_CALL_PATH, "--list"], timeout=LIST_TIMEOUT_S)
    if listing.exit_code != 0:
        raise McpToolsUnavailable(f"task {task.id}: its MCP tools could not be listed: "
                             f"{(listing.stderr or listing.stdout).strip()[-500:]}")
    return NOTE.format(path=MCP_CALL_PATH, tools=listing.stdout.rstrip())
