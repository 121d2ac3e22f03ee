#!/bin/sh
# The notes server's tool through mcp-call, which every harness's shell has (docs/tools-mcp.md).
/tmp/.orchard-mcp/mcp-call notes add_note '{"title": "groceries", "body": "milk, eggs"}'
