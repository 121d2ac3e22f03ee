#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M contacts create_contact '{"name": "Maria Gonzalez", "email": "maria.gonzalez@acme.example.com", "phone": "+1 415 555 0142", "company": "Acme Corp"}'
