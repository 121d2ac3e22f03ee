"""The Claw world: small services an assistant acts on — mail, calendar, contacts, notes, todo — each an HTTP
server with a documented JSON API (one module per service on base.py and http_server.py), its tools over MCP
(mcp_stdio.py), seeded state, an `/audit` action log, `/reset` and injected faults (faults.py); and the
grader that checks their state (grade.py, query.py). docs/claw.md says how to write a task on them.

A sandbox runs them as `python -I -S .../claw/run.py serve|mcp|grade ...` (run.py, __main__.py): what runs
there imports the standard library and this package only, relatively, so it also runs as the top-level
package `claw`, and nothing here may import more at module level. The task spec that builds a Claw task on
the host (task.py, pydantic) is imported by the suite loader only."""
