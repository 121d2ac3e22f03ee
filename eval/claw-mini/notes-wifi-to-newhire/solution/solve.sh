#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M notes search_notes '{"query": "office wi-fi"}'
$M mail send_message '{"to": ["ken.ito@example.org"], "subject": "Office Wi-Fi", "body": "Hi Ken, welcome! The office Wi-Fi is Example-Staff, password: sunflower-42\n\nSam"}'
