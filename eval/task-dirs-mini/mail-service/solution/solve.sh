#!/bin/sh
python3 - <<'PY'
import json, os, urllib.request
mail = {"to": "bob@example.org", "subject": "lunch", "body": "Noon at the usual place?"}
request = urllib.request.Request(os.environ["ORCHARD_SERVICE_MAIL_URL"] + "/send", json.dumps(mail).encode(),
                                 {"Content-Type": "application/json"})
print(urllib.request.urlopen(request).read().decode())
PY
