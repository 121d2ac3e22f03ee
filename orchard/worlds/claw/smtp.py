"""The mail service's SMTP door (`serve mail --smtp-port N`): a real SMTP server (aiosmtpd) on 127.0.0.1 that
takes what a client submits as the user's `send_message` — audited as such (`via: smtp`), meeting the same
faults (an injected 429 or 500 is SMTP's `451`: try again later). The message's To and Cc are its
recipients (else the envelope's), its text/plain part its body, its other parts with a file name its
attachments; an `In-Reply-To: <ID>` naming a message of the mailbox keeps that thread.

aiosmtpd is imported only here, so a mail service without SMTP starts without it."""

from __future__ import annotations

from email import policy
from email.parser import BytesParser
from email.utils import getaddresses

from .base import Service


def message_arguments(data: bytes, envelope_to: list, known_ids: set) -> dict:
    """send_message's arguments for a submitted message."""
    message = BytesParser(policy=policy.default).parsebytes(data)
    to = [addr for _, addr in getaddresses(message.get_all("To", []))] or list(envelope_to)
    cc = [addr for _, addr in getaddresses(message.get_all("Cc", []))]
    body_part = message.get_body(preferencelist=("plain", "html"))
    arguments = {"to": to, "subject": str(message.get("Subject", "")),
                 "body": body_part.get_content().strip() if body_part is not None else ""}
    if cc:
        arguments["cc"] = cc
    attachments = []
    for part in message.iter_attachments():
        name = part.get_filename()
        if not name:
            continue
        content = part.get_content()
        text = content if isinstance(content, str) else content.decode("utf-8", "replace")
        attachments.append({"name": name, "text": text})
    if attachments:
        arguments["attachments"] = attachments
    replied = str(message.get("In-Reply-To", "")).strip().strip("<>").split("@")[0]
    if replied in known_ids:
        arguments["in_reply_to"] = replied
    return arguments


class Door:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 — aiosmtpd's name
        with self.service.lock:
            known = {m["id"] for m in self.service.state["messages"]}
        try:
            arguments = message_arguments(envelope.original_content or envelope.content, envelope.rcpt_tos, known)
        except Exception as exc:  # noqa: BLE001 — a message the parser cannot read is the client's
            return f"554 5.6.0 the message cannot be read: {exc}"
        status, answer = self.service.call("send_message", arguments, via="smtp")
        if status == 200:
            return f"250 2.0.0 sent as {answer['sent']['id']}"
        if status >= 500 or status == 429:
            return f"451 4.3.0 {answer['error']}"
        return f"550 5.7.0 {answer['error']}"


def start_smtp(service: Service, port: int) -> object:
    """Serve SMTP on 127.0.0.1:port from a thread of its own; returns once it accepts connections."""
    from aiosmtpd.controller import Controller

    controller = Controller(Door(service), hostname="127.0.0.1", port=port)
    controller.start()
    print(f"claw {service.name} SMTP on 127.0.0.1:{port}", flush=True)
    return controller
