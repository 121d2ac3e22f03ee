#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M calendar list_events '{"start": "2026-03-05T00:00", "end": "2026-03-06T00:00"}'
$M calendar update_event '{"event_id": "e1", "start": "2026-03-06T08:30"}'
