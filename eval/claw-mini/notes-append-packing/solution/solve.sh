#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M notes search_notes '{"query": "packing"}'
$M notes update_note '{"note_id": "n1", "append": "phone charger"}'
