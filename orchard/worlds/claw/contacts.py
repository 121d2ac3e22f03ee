"""The contacts service: the user's address book. Its state:

    {"contacts": [{"id", "name", "email", "phone", "company", "title", "notes", "tags": [...]}]}"""

from __future__ import annotations

from .base import Fields, Service, action, bad, not_found, string, strings, unique_ids
from .mail import address

FIELDS = ("id", "name", "email", "phone", "company", "title", "notes", "tags")
TEXT_FIELDS = ("name", "email", "phone", "company", "title", "notes")
EDITABLE = {"name": string("full name"), "email": string("email address"), "phone": string("phone number"),
            "company": string("company"), "title": string("job title"), "notes": string("free text"),
            "tags": strings("tags")}


class Contacts(Service):
    name = "contacts"
    description = "The user's address book: search, read, add, change and remove contacts."

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "contacts seed", ("contacts",))
        contacts = []
        for index, raw in enumerate(f.items("contacts")):
            c = Fields(raw, f"contacts seed.contacts[{index}]", FIELDS)
            contact = {"id": c.required("id"), "name": c.required("name")}
            contact.update({key: c.text(key) for key in TEXT_FIELDS if key != "name"})
            contact["email"] = contact["email"].lower()
            contact["tags"] = c.texts("tags")
            contacts.append(contact)
        unique_ids(contacts, "contacts seed.contacts")
        return {"contacts": contacts}

    def _contact(self, contact_id: str) -> dict:
        for contact in self.state["contacts"]:
            if contact["id"] == contact_id:
                return contact
        raise not_found(f"no contact {contact_id!r} (search_contacts gives the ids)")

    def _fields(self, values: dict) -> dict:
        fields = {key: value for key, value in values.items() if value is not None}
        if fields.get("email"):
            fields["email"] = address(fields["email"], "email")
        return fields

    @action("Every contact, by name.", mutates=False)
    def list_contacts(self):
        return {"contacts": sorted(self.state["contacts"], key=lambda c: c["name"].lower())}

    @action("Contacts whose name, email, phone, company, title, notes or tags contain all the words of the "
            "query.", {"query": string("words to look for (case does not matter)")}, ("query",), mutates=False)
    def search_contacts(self, query: str):
        words = query.lower().split()
        found = [c for c in self.state["contacts"]
                 if all(w in " ".join([*(c[k] for k in TEXT_FIELDS), *c["tags"]]).lower() for w in words)]
        return {"query": query, "contacts": found}

    @action("Read one contact.", {"contact_id": string("the contact's id")}, ("contact_id",), mutates=False)
    def get_contact(self, contact_id: str):
        return dict(self._contact(contact_id))

    @action("Add a contact.", EDITABLE, ("name",))
    def create_contact(self, name: str, **values):
        contact = {"id": self.new_id("c"), "name": name, **{key: "" for key in TEXT_FIELDS if key != "name"},
                   "tags": []}
        contact.update(self._fields(values))
        self.state["contacts"].append(contact)
        return {"created": contact}

    @action("Change a contact's fields (those given; tags replaces the list).",
            {"contact_id": string("the contact"), **EDITABLE}, ("contact_id",))
    def update_contact(self, contact_id: str, **values):
        contact = self._contact(contact_id)
        fields = self._fields(values)
        if not fields:
            raise bad("update_contact needs at least one field to change")
        contact.update(fields)
        return {"updated": contact}

    @action("Remove a contact.", {"contact_id": string("the contact")}, ("contact_id",))
    def delete_contact(self, contact_id: str):
        contact = self._contact(contact_id)
        self.state["contacts"].remove(contact)
        return {"deleted": contact_id}
