#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail search_messages '{"query": "invoice march"}'
$M mail forward '{"message_id": "m2", "to": ["accounts@example.org"], "body": "For processing."}'
