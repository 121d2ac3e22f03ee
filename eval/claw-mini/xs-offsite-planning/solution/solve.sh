#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M contacts search_contacts '{"query": "offsite"}'
$M calendar create_event '{"title": "Q2 offsite planning", "start": "2026-03-05T10:00", "duration_minutes": 90, "attendees": ["alice.wong@example.org", "omar.haddad@example.org", "lina.ortiz@example.org"]}'
$M mail send_message '{"to": ["alice.wong@example.org", "omar.haddad@example.org", "lina.ortiz@example.org"], "subject": "Q2 offsite planning: agenda", "body": "Hi all,\n\nAgenda for Thursday:\n1. budget\n2. venue\n3. dates\n\nSam"}'
