#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail send_message '{"to": ["bob.lee@example.org"], "subject": "Lunch on Thursday?", "body": "Hi Bob,\n\nAre you free for lunch this Thursday at noon?\n\nSam"}'
