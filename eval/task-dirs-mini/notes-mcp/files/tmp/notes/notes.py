"""A notes server over MCP (streamable HTTP): add_note keeps a note in its state directory, list_notes
reads them back."""

import os
import sys

from mcp.server.mcpserver import MCPServer

NOTES = os.path.join(os.environ.get("ORCHARD_SERVICE_STATE", "."), "notes.txt")
server = MCPServer("notes")


@server.tool()
def add_note(title: str, body: str) -> str:
    """Keep a note."""
    with open(NOTES, "a") as f:
        f.write(f"{title}: {body}\n")
    return f"kept {title}"


@server.tool()
def list_notes() -> str:
    """Every note kept so far, one a line."""
    return open(NOTES).read() if os.path.exists(NOTES) else "(no notes)"


server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
