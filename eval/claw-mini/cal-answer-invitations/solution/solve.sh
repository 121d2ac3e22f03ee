#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M calendar list_invitations '{}'
$M calendar respond_to_invitation '{"event_id": "e1", "response": "accepted"}'
$M calendar respond_to_invitation '{"event_id": "e2", "response": "declined"}'
