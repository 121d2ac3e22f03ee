#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M contacts search_contacts '{"query": "alice wong"}'
$M contacts search_contacts '{"query": "bob lee"}'
$M calendar create_event '{"title": "Design review", "start": "2026-03-04T14:00", "end": "2026-03-04T15:00", "attendees": ["alice.wong@example.org", "bob.lee@example.org"]}'
