#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M todo create_task '{"title": "Renew passport", "due": "2026-04-01", "priority": "high"}'
