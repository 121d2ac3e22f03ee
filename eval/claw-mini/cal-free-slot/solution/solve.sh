#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M calendar free_busy '{"emails": ["sam@example.org", "alice.wong@example.org", "bob.lee@example.org"], "start": "2026-03-03T09:00", "end": "2026-03-03T17:00"}'
$M calendar create_event '{"title": "Roadmap sync", "start": "2026-03-03T12:00", "duration_minutes": 60, "attendees": ["alice.wong@example.org", "bob.lee@example.org"]}'
