#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail save_draft '{"in_reply_to": "m1", "body": "Hi Dave,\n\nThanks for the proposal. Could you send me a cost breakdown for each phase?\n\nSam"}'
$M mail list_messages '{"folder": "drafts"}'
