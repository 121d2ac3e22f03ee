#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail read_message '{"message_id": "m1"}'
$M mail reply '{"message_id": "m1", "body": "Hi Greg,\n\nGood to meet you too. I am sorry, but I cannot share our customer contacts: they are confidential.\n\nBest, Sam"}'
