#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail list_messages '{}'
for id in n1 n2 n3; do $M mail move_message "{\"message_id\": \"$id\", \"folder\": \"archive\"}"; done
