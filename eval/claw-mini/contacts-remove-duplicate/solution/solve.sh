#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M contacts search_contacts '{"query": "priya shah"}'
$M contacts delete_contact '{"contact_id": "c2"}'
