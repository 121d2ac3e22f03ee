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

retry $M mail send_message '{"to": ["team@example.org"], "subject": "Meeting notes 2 March", "body": "Hi team,\n\nWe agreed to ship on 16 March.\n\nSam"}'
