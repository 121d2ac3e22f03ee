#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M notes create_note '{"title": "Parking", "body": "Level 3, spot 42", "tags": ["car"]}'
