"""The notes service: the user's notes, the assistant's memory. Its state:

    {"notes": [{"id", "title", "body", "tags": [...], "updated"}]}"""

from __future__ import annotations

from .base import (Fields, Service, action, bad, not_found, seed_time, string, strings,
                                     unique_ids)


class Notes(Service):
    name = "notes"
    description = "The user's notes (the assistant's memory): search, read, write, change, delete."

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "notes seed", ("notes",))
        notes = []
        for index, raw in enumerate(f.items("notes")):
            where = f"notes seed.notes[{index}]"
            n = Fields(raw, where, ("id", "title", "body", "tags", "updated"))
            notes.append({"id": n.required("id"), "title": n.required("title"), "body": n.text("body"),
                          "tags": n.texts("tags"),
                          "updated": seed_time(n.text("updated", "2026-03-01T08:00"), f"{where}.updated")})
        unique_ids(notes, "notes seed.notes")
        return {"notes": notes}

    def _note(self, note_id: str) -> dict:
        for note in self.state["notes"]:
            if note["id"] == note_id:
                return note
        raise not_found(f"no note {note_id!r} (list_notes or search_notes give the ids)")

    @staticmethod
    def _summary(note: dict) -> dict:
        return {"id": note["id"], "title": note["title"], "tags": note["tags"], "updated": note["updated"]}

    @action("List notes (titles, tags), optionally those with a tag.", {"tag": string("only notes with this tag")},
            mutates=False)
    def list_notes(self, tag: str | None = None):
        found = [n for n in self.state["notes"] if tag is None or tag in n["tags"]]
        return {"notes": [self._summary(n) for n in found]}

    @action("Notes whose title, body or tags contain all the words of the query.",
            {"query": string("words to look for (case does not matter)")}, ("query",), mutates=False)
    def search_notes(self, query: str):
        words = query.lower().split()
        found = [n for n in self.state["notes"]
                 if all(w in " ".join([n["title"], n["body"], *n["tags"]]).lower() for w in words)]
        return {"query": query, "notes": [{**self._summary(n), "body": n["body"]} for n in found]}

    @action("Read one note whole.", {"note_id": string("the note's id")}, ("note_id",), mutates=False)
    def read_note(self, note_id: str):
        return dict(self._note(note_id))

    @action("Write a new note.", {"title": string("title"), "body": string("text"), "tags": strings("tags")},
            ("title",))
    def create_note(self, title: str, body: str = "", tags: list | None = None):
        note = {"id": self.new_id("n"), "title": title, "body": body, "tags": list(tags or []),
                "updated": self.now()}
        self.state["notes"].append(note)
        return {"created": note}

    @action("Change a note: a new title, body or tags, or `append` a line to its body.",
            {"note_id": string("the note"), "title": string("new title"), "body": string("new body (replaces it)"),
             "append": string("a line added at the end of the body"), "tags": strings("new tags (replace them)")},
            ("note_id",))
    def update_note(self, note_id: str, title: str | None = None, body: str | None = None,
                    append: str | None = None, tags: list | None = None):
        note = self._note(note_id)
        if title is None and body is None and append is None and tags is None:
            raise bad("update_note needs title, body, append or tags")
        if title is not None:
            note["title"] = title
        if body is not None:
            note["body"] = body
        if append is not None:
            note["body"] = (note["body"].rstrip("\n") + "\n" + append) if note["body"] else append
        if tags is not None:
            note["tags"] = list(tags)
        note["updated"] = self.now()
        return {"updated": note}

    @action("Delete a note.", {"note_id": string("the note")}, ("note_id",))
    def delete_note(self, note_id: str):
        self.state["notes"].remove(self._note(note_id))
        return {"deleted": note_id}
