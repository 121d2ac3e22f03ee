#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
retry() {  # a call the service failed (429, 500) is retried after a second, up to 6 times
  for attempt in 1 2 3 4 5 6; do
    if "$@"; then return 0; fi
    sleep 1
  done
  return 1
}

retry $M todo create_task '{"title": "Order new badges", "due": "2026-03-09"}'
retry $M todo create_task '{"title": "Update the org chart", "due": "2026-03-09"}'
retry $M todo create_task '{"title": "Archive the 2025 projects", "due": "2026-03-09"}'
