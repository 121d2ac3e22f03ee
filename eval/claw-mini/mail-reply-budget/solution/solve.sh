#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail search_messages '{"query": "Q2 budget"}'
$M mail reply '{"message_id": "m1", "body": "Hi Carol,\n\nThe Q2 budget is approved.\n\nSam"}'
