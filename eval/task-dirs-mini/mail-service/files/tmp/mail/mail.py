"""A tiny mail service: POST /send keeps the message in its state directory; GET /audit lists the calls it
got; GET /health answers once it is up."""

import http.server
import json
import os
import sys

STATE = os.environ["ORCHARD_SERVICE_STATE"]


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _audit(self, line):
        with open(os.path.join(STATE, "audit.log"), "a") as f:
            f.write(line + "\n")

    def do_POST(self):
        self._audit("POST " + self.path)
        if self.path != "/send":
            return self._answer(404, b'{"error": "no such endpoint"}')
        try:
            mail = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            assert isinstance(mail, dict) and all(isinstance(mail.get(k), str) for k in ("to", "subject", "body"))
        except (ValueError, AssertionError):
            return self._answer(400, b'{"error": "send a JSON object with to, subject and body"}')
        with open(os.path.join(STATE, "outbox.jsonl"), "a") as f:
            f.write(json.dumps(mail) + "\n")
        self._answer(200, b'{"sent": true}')

    def do_GET(self):
        if self.path == "/audit":
            path = os.path.join(STATE, "audit.log")
            return self._answer(200, open(path, "rb").read() if os.path.exists(path) else b"")
        self._answer(200, b'{"ok": true}')

    def log_message(self, *args):
        sys.stderr.write("mail: " + (args[0] % args[1:]) + "\n")


http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
