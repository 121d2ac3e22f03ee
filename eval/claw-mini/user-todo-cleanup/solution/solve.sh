#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M todo list_tasks '{"include_done": true}'
$M todo delete_task '{"task_id": "t1"}'
$M todo delete_task '{"task_id": "t4"}'
$M user message_user '{"text": "I deleted the finished gym and library to-dos. The finished one about your tax return documents: delete it too, or keep it?"}'
$M todo list_tasks '{"include_done": true}'
