#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail search_messages '{"query": "phone"}'
$M contacts search_contacts '{"query": "tom becker"}'
$M contacts update_contact '{"contact_id": "c1", "phone": "+49 30 1234 5678"}'
