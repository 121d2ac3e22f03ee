#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M calendar list_events '{"start": "2026-03-06T00:00", "end": "2026-03-07T00:00"}'
$M calendar cancel_event '{"event_id": "e1"}'
$M mail send_message '{"to": ["eve.martin@example.org"], "subject": "Our 1:1 on Friday", "body": "Hi Eve,\n\nI had to cancel our 1:1 this Friday. Let us find a new time next week.\n\nSam"}'
