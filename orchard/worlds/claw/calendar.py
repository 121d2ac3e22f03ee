"""The calendar service: the user's events, invitations both ways and free/busy. Its state:

    {"owner": "sam@example.org",
     "events": [{"id", "title", "start", "end", "location", "description", "organizer", "status",
                 "attendees": [{"email", "status"}]}],
     "busy": {"alice@example.org": [{"start", "end"}]}}

Times are the world's local time, `YYYY-MM-DDTHH:MM`. An event the user creates with attendees invites
them (their status `needs-action`); an event someone else organizes lists the user among its attendees, and
`respond_to_invitation` sets the user's status (accepted, declined, tentative). A cancelled event keeps its
place in the state with status `cancelled`. `busy` is what other people's calendars say (free/busy adds the
events they attend)."""

from __future__ import annotations

from datetime import timedelta

from .base import (ActionError, Fields, SeedError, Service, action, bad, boolean, integer,
                                     not_found, parse_time, seed_time, string, strings, time_text, unique_ids)
from .mail import address, addresses

RESPONSES = ("accepted", "declined", "tentative")
ATTENDEE_STATUSES = ("needs-action",) + RESPONSES
EVENT_FIELDS = ("id", "title", "start", "end", "location", "description", "organizer", "attendees", "status")


class Calendar(Service):
    name = "calendar"
    description = "The user's calendar: events, invitations (sent and received), free/busy."

    def state_from_seed(self, seed: dict) -> dict:
        f = Fields(seed, "calendar seed", ("owner", "events", "busy"))
        owner = (f.text("owner", self.user["email"]) or self.user["email"]).lower()
        events = [self._seed_event(raw, f"calendar seed.events[{i}]", owner) for i, raw in enumerate(f.items("events"))]
        unique_ids(events, "calendar seed.events")
        busy_raw = f.get("busy", dict, {})
        busy = {}
        for who, spans in busy_raw.items():
            if not isinstance(spans, list):
                raise SeedError(f"calendar seed.busy.{who} must be a list of {{start, end}}")
            busy[who.lower()] = [self._span(span, f"calendar seed.busy.{who}[{i}]") for i, span in enumerate(spans)]
        return {"owner": owner, "events": events, "busy": busy}

    def _span(self, raw, where: str) -> dict:
        s = Fields(raw, where, ("start", "end", "title"))
        span = {"start": seed_time(s.required("start"), f"{where}.start"),
                "end": seed_time(s.required("end"), f"{where}.end")}
        if span["end"] <= span["start"]:
            raise SeedError(f"{where}: end must be after start")
        return span

    def _seed_event(self, raw, where: str, owner: str) -> dict:
        e = Fields(raw, where, EVENT_FIELDS)
        span = self._span({"start": e.required("start"), "end": e.required("end")}, where)
        attendees = []
        for index, item in enumerate(e.items("attendees")):
            if isinstance(item, str):
                item = {"email": item}
            a = Fields(item, f"{where}.attendees[{index}]", ("email", "status", "name"))
            status = a.text("status", "needs-action")
            if status not in ATTENDEE_STATUSES:
                raise SeedError(f"{where}.attendees[{index}].status must be one of {', '.join(ATTENDEE_STATUSES)}")
            try:
                attendees.append({"email": address(a.required("email")), "status": status})
            except ActionError as exc:
                raise SeedError(f"{where}.attendees[{index}]: {exc}") from None
        status = e.text("status", "confirmed")
        if status not in ("confirmed", "cancelled"):
            raise SeedError(f"{where}.status must be confirmed or cancelled")
        return {"id": e.required("id"), "title": e.required("title"), **span,
                "location": e.text("location"), "description": e.text("description"),
                "organizer": (e.text("organizer", owner) or owner).lower(), "attendees": attendees,
                "status": status}

    # --- helpers ---

    def _event(self, event_id: str) -> dict:
        for event in self.state["events"]:
            if event["id"] == event_id:
                return event
        raise not_found(f"no event {event_id!r} (list_events gives the ids)")

    def _own(self, event_id: str, doing: str) -> dict:
        event = self._event(event_id)
        if event["organizer"] != self.state["owner"]:
            raise ActionError(403, f"you cannot {doing} {event_id}: {event['organizer']} organizes it; "
                                   "respond_to_invitation answers it")
        if event["status"] == "cancelled":
            raise bad(f"event {event_id} is cancelled")
        return event

    def _my_status(self, event: dict) -> str:
        if event["organizer"] == self.state["owner"]:
            return "organizer"
        for attendee in event["attendees"]:
            if attendee["email"] == self.state["owner"]:
                return attendee["status"]
        return "not invited"

    def _view(self, event: dict) -> dict:
        return {**event, "my_status": self._my_status(event)}

    @staticmethod
    def _overlaps(span: dict, start, end) -> bool:
        return (end is None or parse_time(span["start"], "start") < end) and (
            start is None or parse_time(span["end"], "end") > start)

    def _times(self, start: str, end: str | None, duration_minutes: int | None):
        begin = parse_time(start, "start")
        if end:
            finish = parse_time(end, "end")
        else:
            finish = begin + timedelta(minutes=duration_minutes or 60)
        if finish <= begin:
            raise bad("end must be after start")
        return time_text(begin), time_text(finish)

    # --- reading ---

    @action("List events overlapping a time range (default: all), by start time; each with my_status "
            "(organizer, accepted, declined, tentative, needs-action).",
            {"start": string("from this time, e.g. 2026-03-04T00:00"), "end": string("until this time"),
             "include_cancelled": boolean("also cancelled events")}, mutates=False)
    def list_events(self, start: str | None = None, end: str | None = None, include_cancelled: bool = False):
        begin = parse_time(start, "start") if start else None
        finish = parse_time(end, "end") if end else None
        found = [e for e in self.state["events"] if (include_cancelled or e["status"] != "cancelled")
                 and self._overlaps(e, begin, finish)]
        found.sort(key=lambda e: e["start"])
        return {"events": [self._view(e) for e in found]}

    @action("Read one event.", {"event_id": string("the event's id")}, ("event_id",), mutates=False)
    def get_event(self, event_id: str):
        return self._view(self._event(event_id))

    @action("Invitations waiting for the user's answer (events others organize, status needs-action).",
            mutates=False)
    def list_invitations(self):
        found = [e for e in self.state["events"] if e["status"] != "cancelled"
                 and self._my_status(e) == "needs-action"]
        return {"invitations": [self._view(e) for e in sorted(found, key=lambda e: e["start"])]}

    @action("Busy times of people (the user's address included) in a range: for finding a time everyone is "
            "free.", {"emails": strings("their addresses"), "start": string("range start"),
                      "end": string("range end")}, ("emails", "start", "end"), mutates=False)
    def free_busy(self, emails: list, start: str, end: str):
        begin, finish = parse_time(start, "start"), parse_time(end, "end")
        owner = self.state["owner"]
        result = {}
        for who in addresses(emails, "emails"):
            spans = [] if who == owner else [dict(s) for s in self.state["busy"].get(who, [])]
            for event in self.state["events"]:
                if event["status"] == "cancelled":
                    continue
                going = event["organizer"] == who or any(
                    a["email"] == who and a["status"] != "declined" for a in event["attendees"])
                if going:
                    spans.append({"start": event["start"], "end": event["end"]})
            spans = [s for s in spans if self._overlaps(s, begin, finish)]
            result[who] = sorted(({"start": s["start"], "end": s["end"]} for s in spans), key=lambda s: s["start"])
        return {"start": time_text(begin), "end": time_text(finish), "busy": result}

    # --- writing ---

    @action("Create an event; attendees are invited.",
            {"title": string("title"), "start": string("start, e.g. 2026-03-04T14:00"),
             "end": string("end (or duration_minutes)"), "duration_minutes": integer("length (default 60)"),
             "attendees": strings("invitees' addresses"), "location": string("where"),
             "description": string("details")}, ("title", "start"))
    def create_event(self, title: str, start: str, end: str | None = None, duration_minutes: int | None = None,
                     attendees: list | None = None, location: str = "", description: str = ""):
        begin, finish = self._times(start, end, duration_minutes)
        owner = self.state["owner"]
        event = {"id": self.new_id("e"), "title": title, "start": begin, "end": finish, "location": location,
                 "description": description, "organizer": owner,
                 "attendees": [{"email": a, "status": "needs-action"}
                               for a in addresses(attendees or [], "attendees") if a != owner],
                 "status": "confirmed"}
        self.state["events"].append(event)
        return {"created": self._view(event)}

    @action("Change an event the user organizes: its title, time, place, details or attendees (moving its "
            "start keeps its length unless end is given).",
            {"event_id": string("the event"), "title": string("new title"), "start": string("new start"),
             "end": string("new end"), "location": string("new location"), "description": string("new details"),
             "add_attendees": strings("invite these too"), "remove_attendees": strings("uninvite these")},
            ("event_id",))
    def update_event(self, event_id: str, title: str | None = None, start: str | None = None,
                     end: str | None = None, location: str | None = None, description: str | None = None,
                     add_attendees: list | None = None, remove_attendees: list | None = None):
        event = self._own(event_id, "change")
        if start or end:
            length = parse_time(event["end"], "end") - parse_time(event["start"], "start")
            begin = start or event["start"]
            finish = end or time_text(parse_time(begin, "start") + length)
            event["start"], event["end"] = self._times(begin, finish, None)
        for key, value in (("title", title), ("location", location), ("description", description)):
            if value is not None:
                event[key] = value
        gone = set(addresses(remove_attendees or [], "remove_attendees"))
        event["attendees"] = [a for a in event["attendees"] if a["email"] not in gone]
        for who in addresses(add_attendees or [], "add_attendees"):
            if who != self.state["owner"] and all(a["email"] != who for a in event["attendees"]):
                event["attendees"].append({"email": who, "status": "needs-action"})
        return {"updated": self._view(event)}

    @action("Cancel an event the user organizes (its attendees are told).", {"event_id": string("the event")},
            ("event_id",))
    def cancel_event(self, event_id: str):
        event = self._own(event_id, "cancel")
        event["status"] = "cancelled"
        return {"cancelled": event_id}

    @action("Answer an invitation to an event someone else organizes.",
            {"event_id": string("the event"), "response": string("accepted, declined or tentative")},
            ("event_id", "response"))
    def respond_to_invitation(self, event_id: str, response: str):
        response = {"accept": "accepted", "decline": "declined"}.get(response, response)
        if response not in RESPONSES:
            raise bad(f"response must be one of {', '.join(RESPONSES)}")
        event = self._event(event_id)
        for attendee in event["attendees"]:
            if attendee["email"] == self.state["owner"]:
                attendee["status"] = response
                return {"responded": self._view(event)}
        if event["organizer"] == self.state["owner"]:
            raise bad(f"you organize {event_id}; there is no invitation to answer")
        raise bad(f"you are not invited to {event_id}")
