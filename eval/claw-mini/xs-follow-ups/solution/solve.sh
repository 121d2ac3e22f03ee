#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M todo list_tasks '{"tag": "waiting-on"}'
$M mail send_message '{"to": ["lina.ortiz@example.org"], "subject": "Reminder: signed contract", "body": "Hi Lina, a friendly reminder about the signed contract. Thanks! Sam"}'
$M mail send_message '{"to": ["omar.haddad@example.org"], "subject": "Reminder: slides", "body": "Hi Omar, a friendly reminder about the slides. Thanks! Sam"}'
$M notes search_notes '{"query": "follow-ups"}'
$M notes update_note '{"note_id": "n1", "append": "reminded on 2 March"}'
