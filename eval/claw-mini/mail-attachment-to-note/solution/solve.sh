#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
$M mail get_attachment '{"message_id": "m1", "name": "holidays-2026.txt"}' > /tmp/attachment.json
python3 - <<'PY'
import json, subprocess
text = json.loads(open("/tmp/attachment.json").read())["text"]
subprocess.run(["/tmp/.orchard-mcp/mcp-call", "notes", "create_note", json.dumps({"title": "Holidays 2026", "body": text})], check=True)
PY
