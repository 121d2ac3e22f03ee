#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail read_message '{"message_id": "m1"}'
$M contacts search_contacts '{"query": "john"}'
$M mail reply '{"message_id": "m1", "body": "Hi Priya,\n\nI have two Johns in my contacts: John Park (Park Logistics) and John Silva (Silva Legal). Which John should get the signed contract?\n\nSam"}'
