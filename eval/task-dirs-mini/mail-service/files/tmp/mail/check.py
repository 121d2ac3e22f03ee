"""The grader's check, run as the services' user: the mail is in the service's outbox, and its audit log
shows it came through the API."""

import json
import os
import sys
import urllib.request

outbox = os.path.join(os.environ["ORCHARD_SERVICE_MAIL_STATE"], "outbox.jsonl")
mails = [json.loads(line) for line in open(outbox)] if os.path.exists(outbox) else []
wanted = [m for m in mails if m["to"] == "bob@example.org" and m["subject"] == "lunch"
          and "noon" in m["body"].lower()]
audit = urllib.request.urlopen(os.environ["ORCHARD_SERVICE_MAIL_URL"] + "/audit").read().decode()
print(f"{len(mails)} mail(s) sent, {len(wanted)} as asked; audit: {audit.count('POST /send')} send call(s)")
sys.exit(0 if wanted and "POST /send" in audit else 1)
