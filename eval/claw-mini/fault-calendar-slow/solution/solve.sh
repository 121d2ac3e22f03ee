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

retry $M calendar create_event '{"title": "Budget review", "start": "2026-03-03T15:00", "end": "2026-03-03T16:00", "attendees": ["carol.diaz@example.org"]}'
