#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M calendar list_events '{"start": "2026-03-06T13:00", "end": "2026-03-06T17:00"}'
$M user message_user '{"text": "On Friday 6 March you are free from 14:30 to 15:00 (the gym is cancelled); 13:00-14:30 is the budget review and 15:00-17:00 the interview."}'
