"""The mail service: one user's mailbox — folders (inbox, sent, drafts, archive, trash), threads, replies,
forwards, drafts and text attachments — with an optional SMTP door (smtp.py). Its state:

    {"address": "sam@example.org", "name": "Sam Rivera",
     "messages": [{"id", "thread", "folder", "from", "from_name", "to": [...], "cc": [...], "subject",
                   "body", "date", "read", "labels": [...], "in_reply_to",
                   "attachments": [{"name", "content_type", "text"}]}]}

Addresses are kept bare and lower case (`Carol Diaz <Carol@example.org>` is kept as carol@example.org);
what the agent sends is in folder `sent`, from the user's address, dated by the world's clock."""

from __future__ import annotations

from .base import (ActionError, Fields, SeedError, Service, action, bad, boolean, integer,
                                     not_found, objects, seed_time, string, strings, unique_ids)

FOLDERS = ("inbox", "sent", "drafts", "archive", "trash")
MOVABLE = ("inbox", "archive", "trash")
MESSAGE_FIELDS = ("id", "thread", "folder", "from", "from_name", "to", "cc", "subject", "body", "date", "read",
                  "labels", "attachments", "in_reply_to")
ATTACHMENT_FIELDS = ("name", "content_type", "text")
ATTACHMENTS = objects("attachments: each {\"name\", \"text\"} (a new text file) or {\"message_id\", \"name\"} "
                      "(an attachment of a message in the mailbox)",
                      {"name": string("file name"), "text": string("its content"),
                       "message_id": string("the message that has it")})


NOT_IN_ADDRESS = set(' \t\r\n<>,;"')


def _is_address(text: str) -> bool:
    local, at, domain = text.partition("@")
    return bool(local and at and "." in domain.strip(".") and "@" not in domain
                and not NOT_IN_ADDRESS.intersection(text))


def display_name(text: str) -> str:
    """The name of `Name <addr>` ("" for a bare address)."""
    return text.split("<", 1)[0].strip().strip('"').strip() if "<" in text else ""


def address(text: str, what: str = "address") -> str:
    """The bare address of `Name <addr>`, `<addr>` or `addr`, lower case; 400 when it is not one."""
    found = (text or "").strip()
    if "<" in found:
        found = found.split("<", 1)[1].split(">", 1)[0]
    found = found.strip().lower()
    if not _is_address(found):
        raise bad(f"{what} {text!r} is not an email address (look the person up in contacts)")
    return found


def _split(value: str) -> list:
    """`a@x, "Diaz, Carol" <c@y>` -> its addresses: commas and semicolons outside quotes separate them."""
    parts, current, quoted = [], "", False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char in ",;" and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + [current]


def addresses(values: list, what: str) -> list:
    """Every address of the list (an item may hold several, separated by commas), once each."""
    found = []
    for value in values or []:
        for part in _split(value):
            if part.strip():
                bare = address(part, what)
                if bare not in found:
                    found.append(bare)
    return found


class Mail(Service):
    name = "mail"
    description = "The user's mailbox: read, search, send, reply, forward, drafts, attachments."

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "mail seed", ("address", "name", "messages"))
        me = f.text("address", self.user["email"]) or self.user["email"]
        state = {"address": me.lower(), "name": f.text("name", self.user["name"]), "messages": []}
        for index, raw in enumerate(f.items("messages")):
            state["messages"].append(self._seed_message(raw, f"mail seed.messages[{index}]", state["address"]))
        unique_ids(state["messages"], "mail seed.messages")
        return state

    def _seed_message(self, raw, where: str, me: str) -> dict:
        m = Fields(raw, where, MESSAGE_FIELDS)
        message_id = m.required("id")
        folder = m.text("folder", "inbox")
        if folder not in FOLDERS:
            raise SeedError(f"{where}.folder must be one of {', '.join(FOLDERS)}, not {folder!r}")
        try:
            sender = m.text("from", me) or me
            name = m.text("from_name", display_name(sender))
            attachments = []
            for index, item in enumerate(m.items("attachments")):
                a = Fields(item, f"{where}.attachments[{index}]", ATTACHMENT_FIELDS)
                attachments.append({"name": a.required("name"), "content_type": a.text("content_type", "text/plain"),
                                    "text": a.text("text", "")})
            return {"id": message_id, "thread": m.text("thread", message_id) or message_id, "folder": folder,
                    "from": address(sender, "from"), "from_name": name,
                    "to": addresses(m.texts("to", [me]), "to"), "cc": addresses(m.texts("cc"), "cc"),
                    "subject": m.text("subject"), "body": m.text("body"),
                    "date": seed_time(m.text("date", "2026-03-01T08:00"), f"{where}.date"),
                    "read": m.flag("read", folder != "inbox"), "labels": m.texts("labels"),
                    "attachments": attachments, "in_reply_to": m.text("in_reply_to", None)}
        except ActionError as exc:
            raise SeedError(f"{where}: {exc}") from None

    # --- helpers ---

    def _message(self, message_id: str) -> dict:
        for message in self.state["messages"]:
            if message["id"] == message_id:
                return message
        raise not_found(f"no message {message_id!r} (list_messages or search_messages give the ids)")

    @staticmethod
    def _summary(message: dict) -> dict:
        summary = {key: message[key] for key in ("id", "thread", "folder", "from", "from_name", "to", "subject",
                                                  "date", "read")}
        summary["attachments"] = [a["name"] for a in message["attachments"]]
        return summary

    def _attachments(self, items: list | None) -> list:
        found = []
        for item in items or []:
            if not isinstance(item, dict) or not item.get("name"):
                raise bad("each attachment is {\"name\", \"text\"} or {\"message_id\", \"name\"}")
            if item.get("message_id"):
                source = self._message(item["message_id"])
                match = [a for a in source["attachments"] if a["name"] == item["name"]]
                if not match:
                    raise not_found(f"message {item['message_id']} has no attachment {item['name']!r}; it has: "
                                    f"{', '.join(a['name'] for a in source['attachments']) or 'none'}")
                found.append(dict(match[0]))
            else:
                found.append({"name": item["name"], "content_type": "text/plain", "text": str(item.get("text", ""))})
        return found

    def _new(self, folder: str, to: list, cc: list, subject: str, body: str, attachments: list,
             in_reply_to: str | None = None, thread: str | None = None) -> dict:
        message_id = self.new_id("m")
        message = {"id": message_id, "thread": thread or message_id, "folder": folder,
                   "from": self.state["address"], "from_name": self.state["name"], "to": to, "cc": cc,
                   "subject": subject, "body": body, "date": self.now(), "read": True, "labels": [],
                   "attachments": attachments, "in_reply_to": in_reply_to}
        self.state["messages"].append(message)
        return message

    # --- reading ---

    @action("List messages of a folder, newest first: id, thread, from, to, subject, date, read, attachment "
            "names.", {"folder": string("inbox (default), sent, drafts, archive or trash"),
                       "unread_only": boolean("only unread messages"),
                       "limit": integer("at most this many (default 50)")}, mutates=False)
    def list_messages(self, folder: str = "inbox", unread_only: bool = False, limit: int = 50):
        if folder not in FOLDERS:
            raise bad(f"folder must be one of {', '.join(FOLDERS)}")
        found = [m for m in self.state["messages"] if m["folder"] == folder and not (unread_only and m["read"])]
        found.sort(key=lambda m: m["date"], reverse=True)
        return {"folder": folder, "messages": [self._summary(m) for m in found[:max(1, limit)]],
                "total": len(found)}

    @action("Read one message whole (marks it read); attachments are listed by name (get_attachment reads "
            "one).", {"message_id": string("the message's id")}, ("message_id",))
    def read_message(self, message_id: str):
        message = self._message(message_id)
        message["read"] = True
        return {**{k: v for k, v in message.items() if k != "attachments"},
                "attachments": [{"name": a["name"], "content_type": a["content_type"], "size": len(a["text"])}
                                for a in message["attachments"]]}

    @action("Search every folder (or one) for messages whose sender, recipients, subject, body or attachment "
            "names contain all the words of the query.",
            {"query": string("words to look for (case does not matter)"),
             "folder": string("only this folder")}, ("query",), mutates=False)
    def search_messages(self, query: str, folder: str | None = None):
        words = query.lower().split()
        found = []
        for message in self.state["messages"]:
            if folder and message["folder"] != folder:
                continue
            text = " ".join([message["from"], message["from_name"], *message["to"], *message["cc"],
                             message["subject"], message["body"],
                             *(a["name"] for a in message["attachments"])]).lower()
            if all(word in text for word in words):
                found.append(message)
        found.sort(key=lambda m: m["date"], reverse=True)
        return {"query": query, "messages": [self._summary(m) for m in found]}

    @action("Read an attachment of a message.", {"message_id": string("the message's id"),
                                                 "name": string("the attachment's file name")},
            ("message_id", "name"), mutates=False)
    def get_attachment(self, message_id: str, name: str):
        message = self._message(message_id)
        for attachment in message["attachments"]:
            if attachment["name"] == name:
                return dict(attachment)
        raise not_found(f"message {message_id} has no attachment {name!r}; it has: "
                        f"{', '.join(a['name'] for a in message['attachments']) or 'none'}")

    # --- writing ---

    @action("Send a new message (from the user's address).",
            {"to": strings("recipients' addresses"), "subject": string("subject"), "body": string("text"),
             "cc": strings("copies to"), "attachments": ATTACHMENTS,
             "in_reply_to": string("the id of the message this answers (keeps its thread)")},
            ("to", "subject", "body"))
    def send_message(self, to: list, subject: str, body: str, cc: list | None = None,
                     attachments: list | None = None, in_reply_to: str | None = None):
        recipients = addresses(to, "to")
        if not recipients:
            raise bad("send_message needs at least one recipient in to")
        thread = self._message(in_reply_to)["thread"] if in_reply_to else None
        message = self._new("sent", recipients, addresses(cc or [], "cc"), subject, body,
                            self._attachments(attachments), in_reply_to, thread)
        return {"sent": self._summary(message)}

    @action("Reply to a message, in its thread: to its sender (reply_all: and everyone else on it).",
            {"message_id": string("the message answered"), "body": string("text"),
             "reply_all": boolean("also to the other recipients"), "attachments": ATTACHMENTS},
            ("message_id", "body"))
    def reply(self, message_id: str, body: str, reply_all: bool = False, attachments: list | None = None):
        original = self._message(message_id)
        me = self.state["address"]
        to = list(original["to"]) if original["from"] == me else [original["from"]]
        cc = []
        if reply_all:
            cc = [a for a in original["to"] + original["cc"] if a != me and a not in to]
        subject = original["subject"]
        if not subject.lower().startswith("re:"):
            subject = "Re: " + subject
        message = self._new("sent", to, cc, subject, body, self._attachments(attachments), original["id"],
                            original["thread"])
        return {"sent": self._summary(message)}

    @action("Forward a message (with its attachments unless told not to) to new recipients, in its thread.",
            {"message_id": string("the message forwarded"), "to": strings("recipients' addresses"),
             "body": string("a note above the forwarded message"),
             "include_attachments": boolean("forward its attachments too (default true)")},
            ("message_id", "to"))
    def forward(self, message_id: str, to: list, body: str = "", include_attachments: bool = True):
        original = self._message(message_id)
        recipients = addresses(to, "to")
        if not recipients:
            raise bad("forward needs at least one recipient in to")
        subject = original["subject"]
        if not subject.lower().startswith("fwd:"):
            subject = "Fwd: " + subject
        quoted = (f"{body}\n\n---------- Forwarded message ----------\nFrom: {original['from']}\n"
                  f"Date: {original['date']}\nSubject: {original['subject']}\n\n{original['body']}").lstrip()
        attachments = [dict(a) for a in original["attachments"]] if include_attachments else []
        message = self._new("sent", recipients, [], subject, quoted, attachments, original["id"], original["thread"])
        return {"sent": self._summary(message)}

    @action("Save a draft (not sent). With in_reply_to it is a reply in that message's thread.",
            {"to": strings("recipients' addresses"), "subject": string("subject (default: Re: the original's)"),
             "body": string("text"), "cc": strings("copies to"), "attachments": ATTACHMENTS,
             "in_reply_to": string("the id of the message it answers")}, ("body",))
    def save_draft(self, body: str, to: list | None = None, subject: str | None = None, cc: list | None = None,
                   attachments: list | None = None, in_reply_to: str | None = None):
        thread, default_to, default_subject = None, [], ""
        if in_reply_to:
            original = self._message(in_reply_to)
            thread, default_to = original["thread"], [original["from"]]
            default_subject = original["subject"] if original["subject"].lower().startswith("re:") else (
                "Re: " + original["subject"])
        message = self._new("drafts", addresses(to, "to") if to else default_to, addresses(cc or [], "cc"),
                            subject if subject is not None else default_subject, body,
                            self._attachments(attachments), in_reply_to, thread)
        return {"draft": self._summary(message)}

    @action("Send a saved draft.", {"draft_id": string("the draft's id")}, ("draft_id",))
    def send_draft(self, draft_id: str):
        draft = self._message(draft_id)
        if draft["folder"] != "drafts":
            raise bad(f"{draft_id} is not a draft (it is in {draft['folder']})")
        if not draft["to"]:
            raise bad(f"draft {draft_id} has no recipient; save a new draft with to")
        draft["folder"], draft["date"] = "sent", self.now()
        return {"sent": self._summary(draft)}

    @action("Move a message to inbox, archive or trash.",
            {"message_id": string("the message"), "folder": string("inbox, archive or trash")},
            ("message_id", "folder"))
    def move_message(self, message_id: str, folder: str):
        if folder not in MOVABLE:
            raise bad(f"a message can be moved to {', '.join(MOVABLE)} only")
        message = self._message(message_id)
        if message["folder"] in ("sent", "drafts") and folder == "inbox":
            raise bad("a sent message or a draft cannot be moved to the inbox")
        message["folder"] = folder
        return {"moved": self._summary(message)}

    @action("Delete a message (it goes to trash).", {"message_id": string("the message")}, ("message_id",))
    def delete_message(self, message_id: str):
        message = self._message(message_id)
        message["folder"] = "trash"
        return {"deleted": message_id}
