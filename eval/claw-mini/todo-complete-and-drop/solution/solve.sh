#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M todo list_tasks '{}'
$M todo complete_task '{"task_id": "t1"}'
$M todo delete_task '{"task_id": "t2"}'
