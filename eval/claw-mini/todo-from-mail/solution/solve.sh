#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail read_message '{"message_id": "m1"}'
$M todo create_task '{"title": "Draft the project charter", "due": "2026-03-06"}'
$M todo create_task '{"title": "Set up the shared drive", "due": "2026-03-06"}'
$M todo create_task '{"title": "Send the stakeholder list to Lee", "due": "2026-03-06"}'
