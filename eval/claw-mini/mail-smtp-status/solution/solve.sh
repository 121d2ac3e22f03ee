#!/bin/sh
set -e
M=/tmp/.orchard-mcp/mcp-call
python3 - <<'PY'
import os, smtplib
from email.message import EmailMessage
host, port = os.environ["CLAW_MAIL_SMTP"].split(":")
message = EmailMessage()
message["From"], message["To"], message["Subject"] = "sam@example.org", "team@example.org", "Weekly status"
message.set_content("Hi team,\n\nAll milestones are on track.\n\nSam")
with smtplib.SMTP(host, int(port)) as smtp:
    smtp.send_message(message)
print("sent")
PY
