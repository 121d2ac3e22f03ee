"""A task's tools over MCP (docs/tools-mcp.md), as each kind of harness takes them: `toolset.py` gives a
harness that runs in Orchard's process (react) the tools as functions through the sandbox's ports;
`mcp_call.py` is the `mcp-call` command that a bash-only harness (mini-swe-agent) runs inside the sandbox,
installed by `install.py`. A harness says it takes MCP tools with `mcp_tools = True`; `orchard eval`
refuses to pair a task that has MCP servers with one that does not (`check_pairing`)."""

from __future__ import annotations

from orchard.core.errors import InvalidRequest
from orchard.core.task import Task


def takes_mcp_tools(harness: object) -> bool:
    return bool(getattr(harness, "mcp_tools", False))


def check_pairing(harness: object, tasks: list[Task]) -> None:
    """InvalidRequest when tasks provide MCP tools the harness cannot offer its model."""
    needing = [task.id for task in tasks if task.environment.mcp_servers]
    if needing and not takes_mcp_tools(harness):
        shown = ", ".join(needing[:5]) + (f" and {len(needing) - 5} more" if len(needing) > 5 else "")
        raise InvalidRequest(f"harness {getattr(harness, 'name', harness)!r} cannot give its model a task's MCP tools, "
                             f"and tasks {shown} provide theirs over MCP; run them with a harness that takes MCP "
                             "tools (react, mini-swe-agent; docs/tools-mcp.md) or leave them out with --task")
