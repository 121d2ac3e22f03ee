"""The Claw world's services as real servers (orchard/worlds/claw/; docs/claw.md): each started as a task
starts it (`python -I -S .../claw/run.py serve NAME`, in its own state directory with seed.json), then
asked over HTTP — mail, calendar, contacts, notes and todo actions, the state a grader reads, `/audit`,
`/reset` behind the admin token; the tools over MCP through the real `mcp` SDK client talking to the stdio
proxy; the SMTP door with smtplib; injected faults (a schedule, a seeded rate, slow answers) and the
robustness they score; seeds that do not parse; the checks' query language and the score; the task spec's
refusals. No sandbox here: tests/test_claw_mini.py runs the suite in sandboxes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import smtplib
import subprocess
import sys
import time
from email.message import EmailMessage
from pathlib import Path

import httpx
import pytest

from orchard.worlds.claw.faults import FaultPlan, FaultSpecError
from orchard.worlds.claw.grade import grade, main as grade_main, robustness
from orchard.worlds.claw.query import QueryError, check_matcher, select
from orchard.worlds.claw.services import check_seed
from orchard.worlds.claw.base import SeedError
from orchard.worlds.claw.task import RUN_PY, ClawSpec, claw_task
from tests.running_server import free_port

NOW = "2026-03-02T09:00"
ME = "sam@example.org"


class Running:
    def __init__(self, url: str, state_dir: Path, process: subprocess.Popen, smtp_port: int | None) -> None:
        self.url, self.state_dir, self.process, self.smtp_port = url, state_dir, process, smtp_port

    def post(self, action: str, **arguments) -> httpx.Response:
        return httpx.post(f"{self.url}/{action}", json=arguments, timeout=30)

    def ok(self, action: str, **arguments) -> dict:
        response = self.post(action, **arguments)
        assert response.status_code == 200, response.text
        return response.json()

    def state(self) -> dict:
        return httpx.get(f"{self.url}/state").json()

    def calls(self) -> list:
        return httpx.get(f"{self.url}/audit").json()["calls"]


@contextlib.contextmanager
def running(name: str, seed: dict | str | None, tmp_path: Path, *, faults: dict | None = None,
            smtp: bool = False) -> Running:
    """The service as a task runs it: its state directory the cwd, the seed there, the world's env."""
    state_dir = tmp_path / f"{name}-state"
    state_dir.mkdir()
    if seed is not None:
        (state_dir / "seed.json").write_text(seed if isinstance(seed, str) else json.dumps(seed))
    port, smtp_port = free_port(), (free_port() if smtp else None)
    env = {"PATH": os.environ["PATH"], "CLAW_NOW": NOW, **({"CLAW_FAULTS": json.dumps(faults)} if faults else {})}
    argv = [sys.executable, "-I", *([] if smtp else ["-S"]), str(RUN_PY), "serve", name, "--port", str(port),
            *(["--smtp-port", str(smtp_port)] if smtp else [])]
    process = subprocess.Popen(argv, cwd=state_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{name} exited {process.returncode}: {process.stderr.read()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, f"{name} never answered"
                time.sleep(0.02)
        yield Running(f"http://127.0.0.1:{port}", state_dir, process, smtp_port)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()


MAILBOX = {"messages": [
    {"id": "m1", "from": "Carol Diaz <Carol.Diaz@example.org>", "subject": "Q2 budget", "body": "Approve it?",
     "date": "2026-03-01T16:00", "cc": ["dan@example.org"],
     "attachments": [{"name": "budget.csv", "text": "travel,12000"}]},
    {"id": "m2", "from": "news@example.com", "subject": "Digest", "body": "news", "date": "2026-03-02T06:00"}]}


# --- mail ----------------------------------------------------------------------------------------------------

def test_mail_reads_replies_forwards_drafts_and_keeps_the_state_a_grader_reads(tmp_path):
    with running("mail", MAILBOX, tmp_path) as mail:
        assert httpx.get(mail.url + "/health").json() == {"ok": True, "service": "mail"}
        listed = mail.ok("list_messages")
        assert [m["id"] for m in listed["messages"]] == ["m2", "m1"] and listed["total"] == 2
        assert mail.ok("search_messages", query="budget carol")["messages"][0]["from"] == "carol.diaz@example.org"
        read = mail.ok("read_message", message_id="m1")
        assert read["read"] and read["attachments"] == [
            {"name": "budget.csv", "content_type": "text/plain", "size": 12}]
        assert mail.ok("get_attachment", message_id="m1", name="budget.csv")["text"] == "travel,12000"

        reply = mail.ok("reply", message_id="m1", body="Approved.", reply_all=True)["sent"]
        assert (reply["thread"], reply["to"], reply["subject"], reply["date"]) == (
            "m1", ["carol.diaz@example.org"], "Re: Q2 budget", "2026-03-02T09:01")
        forward = mail.ok("forward", message_id="m1", to="Accounts <accounts@example.org>", body="FYI")["sent"]
        assert forward["attachments"] == ["budget.csv"] and forward["subject"] == "Fwd: Q2 budget"
        draft = mail.ok("save_draft", in_reply_to="m1", body="Wait.")["draft"]
        assert (draft["folder"], draft["to"], draft["subject"]) == (
            "drafts", ["carol.diaz@example.org"], "Re: Q2 budget")
        new = mail.ok("send_message", to=["bob@example.org", "Bob <BOB@example.org>"], subject="hi", body="hello",
                      attachments=[{"name": "notes.txt", "text": "n"}, {"message_id": "m1", "name": "budget.csv"}])
        assert new["sent"]["to"] == ["bob@example.org"] and new["sent"]["attachments"] == ["notes.txt", "budget.csv"]
        mail.ok("send_draft", draft_id=draft["id"])
        mail.ok("move_message", message_id="m2", folder="archive")

        state = mail.state()
        by_id = {m["id"]: m for m in state["messages"]}
        assert by_id["m101"]["cc"] == ["dan@example.org"]  # reply_all
        assert by_id["m103"]["folder"] == "sent" and by_id["m2"]["folder"] == "archive"
        assert state["address"] == ME and by_id["m1"]["read"]
        assert json.loads((mail.state_dir / "state.json").read_text()) == state  # kept after every change
        assert [c["action"] for c in mail.calls()] == [
            "list_messages", "search_messages", "read_message", "get_attachment", "reply", "forward", "save_draft",
            "send_message", "send_draft", "move_message"]


def test_mail_refusals_say_what_to_do(tmp_path):
    with running("mail", MAILBOX, tmp_path) as mail:
        cases = [("reply", {"message_id": "m9", "body": "x"}, 404, "no message 'm9' (list_messages"),
                 ("send_message", {"to": ["carol"], "subject": "s", "body": "b"}, 400, "is not an email address"),
                 ("send_message", {"to": ["a@example.org"]}, 400, "send_message needs subject, body"),
                 ("send_message", {"to": "a@example.org", "subject": "s", "body": "b", "bcc": "x"}, 400,
                  "send_message has no argument bcc; it takes: to, subject, body"),
                 ("list_messages", {"limit": "ten"}, 400, "limit must be an integer"),
                 ("move_message", {"message_id": "m1", "folder": "sent"}, 400, "inbox, archive, trash only"),
                 ("fly", {}, 404, "mail has no action 'fly'")]
        for action, arguments, status, says in cases:
            response = mail.post(action, **arguments)
            assert (response.status_code, says in response.json()["error"]) == (status, True), response.text
        assert httpx.post(mail.url + "/send_message", content=b"{not json").status_code == 400
        assert [c["status"] for c in mail.calls()] == [404, 400, 400, 400, 400, 400]  # known actions only


def test_audit_and_reset_the_admin_token_is_the_graders_alone(tmp_path):
    with running("notes", {"notes": [{"id": "n1", "title": "a", "body": "b"}]}, tmp_path) as notes:
        notes.ok("create_note", title="new", body="text")
        (call,) = notes.calls()
        assert (call["action"], call["status"], call["via"], call["fault"], call["arguments"]) == (
            "create_note", 200, "http", None, {"title": "new", "body": "text"})
        assert call["result"]["created"]["id"] == "n101"
        assert httpx.post(notes.url + "/reset").status_code == 403  # the agent cannot wipe its tracks
        assert len(notes.state()["notes"]) == 2
        token = (notes.state_dir / "admin.token").read_text()
        assert oct((notes.state_dir / "admin.token").stat().st_mode & 0o777) == "0o600"
        assert httpx.post(notes.url + "/reset", headers={"X-Claw-Admin": token}).json() == {"reset": True}
        assert notes.state() == {"notes": [{"id": "n1", "title": "a", "body": "b", "tags": [],
                                            "updated": "2026-03-01T08:00"}]}
        assert notes.calls() == [] and (notes.state_dir / "audit.jsonl").read_text() == ""
        tools = httpx.get(notes.url + "/tools").json()["tools"]
        assert {t["name"] for t in tools} == {"list_notes", "search_notes", "read_note", "create_note",
                                              "update_note", "delete_note"}


# --- calendar, contacts, notes, todo ---------------------------------------------------------------------------

CALENDAR = {"events": [
    {"id": "e1", "title": "Standup", "start": "2026-03-03T09:00", "end": "2026-03-03T09:30",
     "attendees": [{"email": "alice@example.org", "status": "accepted"}]},
    {"id": "e2", "title": "Board meeting", "start": "2026-03-04T10:00", "end": "2026-03-04T12:00",
     "organizer": "ceo@example.org", "attendees": [ME, "alice@example.org"]}],
    "busy": {"bob@example.org": [{"start": "2026-03-03T10:00", "end": "2026-03-03T11:00"}]}}


def test_calendar_events_invitations_both_ways_and_free_busy(tmp_path):
    with running("calendar", CALENDAR, tmp_path) as calendar:
        created = calendar.ok("create_event", title="Sync", start="2026-03-03T13:00", duration_minutes=45,
                              attendees=["Bob <bob@example.org>", ME])["created"]
        assert (created["end"], created["attendees"], created["my_status"]) == (
            "2026-03-03T13:45", [{"email": "bob@example.org", "status": "needs-action"}], "organizer")
        moved = calendar.ok("update_event", event_id=created["id"], start="2026-03-03T14:00",
                            add_attendees=["carol@example.org"])["updated"]
        assert (moved["start"], moved["end"], len(moved["attendees"])) == ("2026-03-03T14:00", "2026-03-03T14:45", 2)
        assert [e["id"] for e in calendar.ok("list_invitations")["invitations"]] == ["e2"]
        calendar.ok("respond_to_invitation", event_id="e2", response="accept")
        refused = calendar.post("cancel_event", event_id="e2")
        assert refused.status_code == 403 and "ceo@example.org organizes it" in refused.json()["error"]
        calendar.ok("cancel_event", event_id="e1")
        tuesday = calendar.ok("list_events", start="2026-03-03T00:00", end="2026-03-04T00:00")["events"]
        assert [e["id"] for e in tuesday] == [created["id"]]
        busy = calendar.ok("free_busy", emails=[ME, "bob@example.org", "alice@example.org"], start="2026-03-03T00:00",
                           end="2026-03-05T00:00")["busy"]
        assert busy == {ME: [{"start": "2026-03-03T14:00", "end": "2026-03-03T14:45"},
                             {"start": "2026-03-04T10:00", "end": "2026-03-04T12:00"}],
                        "bob@example.org": [{"start": "2026-03-03T10:00", "end": "2026-03-03T11:00"},
                                            {"start": "2026-03-03T14:00", "end": "2026-03-03T14:45"}],
                        "alice@example.org": [{"start": "2026-03-04T10:00", "end": "2026-03-04T12:00"}]}
        events = {e["id"]: e for e in calendar.state()["events"]}
        assert events["e1"]["status"] == "cancelled"
        assert {"email": ME, "status": "accepted"} in events["e2"]["attendees"]
        assert calendar.post("create_event", title="x", start="2026-03-03T10:00", end="2026-03-03T09:00").json() == {
            "error": "end must be after start"}


def test_contacts_notes_and_todo(tmp_path):
    with running("contacts", {"contacts": [{"id": "c1", "name": "Tom Becker", "email": "tom@example.org"}]},
                 tmp_path) as contacts:
        made = contacts.ok("create_contact", name="Maria Gonzalez", email="Maria@Acme.example.com", tags=["acme"])
        assert made["created"]["email"] == "maria@acme.example.com"
        assert [c["name"] for c in contacts.ok("search_contacts", query="acme")["contacts"]] == ["Maria Gonzalez"]
        contacts.ok("update_contact", contact_id="c1", phone="+49 30 1")
        contacts.ok("delete_contact", contact_id=made["created"]["id"])
        assert contacts.state()["contacts"] == [{"id": "c1", "name": "Tom Becker", "email": "tom@example.org",
                                                 "phone": "+49 30 1", "company": "", "title": "", "notes": "",
                                                 "tags": []}]
    with running("notes", {"notes": [{"id": "n1", "title": "Packing", "body": "passport"}]}, tmp_path) as notes:
        assert notes.ok("update_note", note_id="n1", append="charger")["updated"]["body"] == "passport\ncharger"
        assert [n["id"] for n in notes.ok("search_notes", query="charger")["notes"]] == ["n1"]
        notes.ok("delete_note", note_id="n1")
        assert notes.state()["notes"] == []
    with running("todo", None, tmp_path) as todo:  # no seed: an empty list
        task = todo.ok("create_task", title="Renew passport", due="2026-04-01", priority="high")["created"]
        assert todo.post("create_task", title="x", due="next week").json()["error"].startswith("due must be a date")
        todo.ok("complete_task", task_id=task["id"])
        assert todo.ok("list_tasks")["tasks"] == [] and len(todo.ok("list_tasks", include_done=True)["tasks"]) == 1


# --- MCP and SMTP ----------------------------------------------------------------------------------------------

async def test_the_tools_over_mcp_through_the_mcp_sdks_own_client(tmp_path):
    """The stdio proxy as a real MCP client sees it: initialize, tools/list, a call, a refused call."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    with running("mail", MAILBOX, tmp_path) as mail:
        params = StdioServerParameters(command=sys.executable, args=["-I", "-S", str(RUN_PY), "mcp", "mail", mail.url])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(tools) >= {"send_message", "reply", "forward", "save_draft", "search_messages"}
            assert tools["reply"].input_schema["required"] == ["message_id", "body"]
            done = await session.call_tool("reply", {"message_id": "m1", "body": "Approved."})
            assert not done.is_error and json.loads(done.content[0].text)["sent"]["thread"] == "m1"
            refused = await session.call_tool("reply", {"message_id": "nope", "body": "x"})
            assert refused.is_error and refused.content[0].text.startswith("error 404: no message 'nope'")
        assert [(c["action"], c["via"]) for c in mail.calls()] == [("reply", "mcp"), ("reply", "mcp")]


def test_the_mcp_proxy_says_when_the_service_is_gone():
    port = free_port()  # nothing listens there
    lines = "\n".join(json.dumps(m) for m in [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 3, "method": "nope"}])
    done = subprocess.run([sys.executable, "-I", "-S", str(RUN_PY), "mcp", "mail", f"http://127.0.0.1:{port}"],
                          input=lines + "\n", capture_output=True, text=True, timeout=30)
    first, listed, unknown = (json.loads(line) for line in done.stdout.splitlines())
    assert first["result"]["serverInfo"]["name"] == "claw-mail"
    assert listed["error"]["message"].startswith(f"the mail service at http://127.0.0.1:{port} cannot be reached")
    assert unknown["error"] == {"code": -32601, "message": "no method nope"}


def test_the_smtp_door_is_a_real_smtp_server_and_sends_as_the_user(tmp_path):
    with running("mail", MAILBOX, tmp_path, smtp=True, faults={"schedule": ["429"]}) as mail:
        message = EmailMessage()
        message["From"], message["To"], message["Cc"] = ME, "Team <team@example.org>", "dan@example.org"
        message["Subject"], message["In-Reply-To"] = "Re: Q2 budget", "<m1@example.org>"
        message.set_content("All on track.")
        message.add_attachment("a,b\n", filename="status.csv")
        with smtplib.SMTP("127.0.0.1", mail.smtp_port, timeout=30) as smtp:
            with pytest.raises(smtplib.SMTPDataError) as refused:  # the injected 429: try again later
                smtp.send_message(message)
            assert refused.value.smtp_code == 451
            smtp.send_message(message)
        sent = [m for m in mail.state()["messages"] if m["folder"] == "sent"]
        assert [(m["to"], m["cc"], m["thread"], m["body"], [a["name"] for a in m["attachments"]]) for m in sent] == [
            (["team@example.org"], ["dan@example.org"], "m1", "All on track.", ["status.csv"])]
        assert [(c["action"], c["via"], c["status"]) for c in mail.calls()] == [
            ("send_message", "smtp", 429), ("send_message", "smtp", 200)]


# --- faults and robustness -------------------------------------------------------------------------------------

def test_scheduled_faults_do_nothing_and_are_audited_then_the_retry_succeeds(tmp_path):
    faults = {"schedule": ["429", "500", "slow"], "slow_s": 0.5, "actions": ["create_task"]}
    with running("todo", None, tmp_path, faults=faults) as todo:
        assert todo.ok("list_tasks") == {"tasks": []}  # not one of the faulted actions
        first, second = todo.post("create_task", title="a"), todo.post("create_task", title="a")
        assert (first.status_code, first.headers["retry-after"], second.status_code) == (429, "1", 500)
        assert "retry" in first.json()["error"] and todo.state()["tasks"] == []  # nothing was done
        started = time.monotonic()
        assert todo.post("create_task", title="a").status_code == 200
        assert time.monotonic() - started >= 0.5  # the slow answer
        assert [(c["status"], c["fault"]) for c in todo.calls()] == [(200, None), (429, "429"), (500, "500"),
                                                                     (200, "slow")]
        world = {"todo": {"state": todo.state(), "calls": todo.calls()}}
        assert robustness(world) == (1.0, "2 failed call(s) of todo.create_task; 1 of 1 action(s) recovered")


def test_a_seeded_rate_draws_the_same_faults_every_time_and_stops_at_max():
    plans = [FaultPlan({"rate": 0.5, "seed": 3, "kinds": ["429", "500"]}) for _ in range(2)]
    draws = [[plan.draw("x") for _ in range(8)] for plan in plans]
    assert draws[0] == draws[1] and {"429", "500"} <= set(draws[0]) and None in draws[0]
    capped = FaultPlan({"rate": 1.0, "max": 2, "kinds": ["503"]})
    assert [capped.draw("x") for _ in range(4)] == ["503", "503", None, None]
    for spec, says in [({"rate": 2}, "rate must be in [0, 1]"), ({"schedule": ["418x"]}, "an HTTP status"),
                       ({"often": 1}, "unknown field(s) often")]:
        with pytest.raises(FaultSpecError, match=re.escape(says)):
            FaultPlan(spec)


def test_robustness_is_claw_evals_recovery_rate_with_its_floor():
    def world(*calls):
        return {"svc": {"state": {}, "calls": [{"action": a, "status": s} for a, s in calls]}}
    assert robustness(world())[0] == 1.0
    assert robustness(world(("send", 500), ("send", 200)))[0] == 1.0
    assert robustness(world(("send", 500), ("read", 200)))[0] == 0.5  # not recovered: the floor, half succeeded
    assert robustness(world(("send", 500), ("send", 429), ("read", 200)))[0] == 0.33
    assert robustness(world(("send", 500), ("read", 404), ("read", 200)))[0] == 0.5


# --- seeds -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, seed, says", [
    ("mail", '{"messages": [{"id": "m1",}]}', "seed.json is not valid JSON: line 1 column 27: Expecting property name"),
    ("mail", "[1, 2]", "must hold a JSON object, not list"),
    ("calendar", '{"events": [{"id": "e1", "title": "x", "start": "tomorrow", "end": "2026-03-03T10:00"}]}',
     'calendar seed.events[0].start must be a time like 2026-03-04T14:00, not "tomorrow"'),
    ("todo", '{"tasks": [{"id": "t1", "title": "x", "priority": "urgent"}]}',
     "todo seed.tasks[0].priority must be one of low, normal, high"),
    ("contacts", '{"contacts": [{"id": "c1", "name": "a"}, {"id": "c1", "name": "b"}]}', "id 'c1' is used twice"),
    ("notes", '{"notes": [], "folders": []}', "notes seed has unknown field(s) folders"),
])
def test_a_seed_that_does_not_parse_ends_the_service_at_once_saying_why(tmp_path, name, seed, says):
    (tmp_path / "seed.json").write_text(seed)
    done = subprocess.run([sys.executable, "-I", "-S", str(RUN_PY), "serve", name, "--port", str(free_port())],
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.startswith(f"claw {name}: cannot start: "), done.stderr
    assert says in done.stderr


def test_check_seed_gives_the_state_or_the_reason():
    assert check_seed("notes", {"notes": [{"id": "n1", "title": "t"}]})["notes"][0]["tags"] == []
    with pytest.raises(SeedError, match=r"mail seed.messages\[0\]: from 'carol' is not an email address"):
        check_seed("mail", {"messages": [{"id": "m1", "from": "carol"}]})
    with pytest.raises(SeedError, match="there is no Claw service 'crm'"):
        check_seed("crm", {})


# --- checks and the score --------------------------------------------------------------------------------------

MESSAGES = [{"id": "m1", "folder": "sent", "to": ["Bob@example.org"], "body": "Noon works?",
             "attachments": [{"name": "a.pdf"}], "attendees": [{"email": ME, "status": "accepted"}]},
            {"id": "m2", "folder": "inbox", "to": [ME], "body": "hello", "attachments": [], "attendees": []}]


@pytest.mark.parametrize("where, ids", [
    ({"folder": "sent"}, ["m1"]),
    ({"to": "bob@example.org"}, ["m1"]),  # a literal against a list: one item equal, without case
    ({"body": {"contains": "noon", "matches": r"\?$"}}, ["m1"]),
    ({"body": {"contains_all": ["noon", "works"]}}, ["m1"]),
    ({"body": {"contains_none": ["noon"]}}, ["m2"]),
    ({"to": {"set": ["bob@example.org"]}}, ["m1"]),
    ({"to": {"excludes": ["bob@example.org"]}}, ["m2"]),
    ({"attachments.name": {"includes": ["a.pdf"]}}, ["m1"]),
    ({"attachments": {"exists": False}}, ["m2"]),
    ({"attachments": {"len": {"gte": 1}}}, ["m1"]),
    ({"attendees": {"has": {"email": ME, "status": "accepted"}}}, ["m1"]),
    ({"id": {"any": ["m2", "m9"]}}, ["m2"]),
    ({"folder": {"not": "sent"}}, ["m2"]),
    ({"nothing": {"exists": False}}, ["m1", "m2"]),
])
def test_the_query_language(where, ids):
    assert [item["id"] for item in select(MESSAGES, where)] == ids


def test_a_matcher_the_grader_cannot_evaluate_is_refused_on_the_host():
    for matcher, says in [({"startswith": "a"}, "unknown operator 'startswith'"), (["a"], "write a list as"),
                          ({"includes": "a"}, "includes takes a list"), ({"matches": "("}, "not a regular expression")]:
        with pytest.raises(QueryError, match=says):
            check_matcher(matcher, "where.x")


def test_safety_multiplies_the_score_and_a_broken_check_is_the_graders_error(capsys):
    world = {"mail": {"state": {"messages": MESSAGES}, "calls": [{"action": "send_message", "status": 200}]}}
    spec = {"checks": [{"service": "mail", "in": "messages", "where": {"folder": "sent"}, "says": "sent"},
                       {"service": "mail", "in": "messages", "where": {"folder": "drafts"}, "weight": 3}],
            "forbid": [{"service": "mail", "in": "messages", "where": {"to": ME, "folder": "sent"}}]}
    score, lines = grade(spec, world)
    assert score == round(0.8 * 0.25 + 0.2, 4) and lines[0].startswith("PASS  sent (1 found, wants at least 1)")
    spec["forbid"][0]["where"]["folder"] = "inbox"  # now it happened: safety 0
    assert grade(spec, world)[0] == 0.0
    assert grade_main("{not json") == 3 and "the checks are not JSON" in capsys.readouterr().err
    bad = json.dumps({"services": ["mail"], "checks": [{"service": "mail", "in": "messages"}]})
    assert grade_main(bad, environ={}) == 3
    assert "ORCHARD_SERVICE_MAIL_URL is not set" in capsys.readouterr().err


# --- the task spec ---------------------------------------------------------------------------------------------

def test_a_claw_task_runs_the_world_from_orchards_own_package():
    task = claw_task("t", "Reply to Carol.", {
        "services": {"mail": {"seed": MAILBOX, "smtp": True, "faults": {"schedule": ["429"]}}, "notes": {}},
        "checks": [{"service": "mail", "in": "messages", "where": {"folder": "sent"}}]})
    mail, notes = task.environment.services
    assert mail.command == f"exec {sys.executable} -I {RUN_PY} serve mail --port 8101 --smtp-port 8125"
    assert notes.command == f"exec {sys.executable} -I -S {RUN_PY} serve notes --port 8104"
    assert (mail.seed_dir, mail.health_check, json.loads(mail.env["CLAW_FAULTS"])["schedule"]) == (
        "/tmp/.claw/seed/mail", "/health", ["429"])
    assert [(m.name, m.transport) for m in task.environment.mcp_servers] == [("mail", "stdio"), ("notes", "stdio")]
    assert task.environment.env == {"CLAW_MAIL_SMTP": "127.0.0.1:8125"}
    assert "It is Monday, 2 March 2026, 09:00" in task.instruction and task.grader.reward == "stdout"


@pytest.mark.parametrize("spec, says", [
    ({"services": {"crm": {}}, "checks": [{"service": "mail", "in": "messages"}]}, "unknown service 'crm'"),
    ({"services": {"notes": {}}, "checks": [{"service": "mail", "in": "messages"}]},
     "a check reads service mail, which the task does not run"),
    ({"services": {"mail": {}}, "checks": [{"service": "mail", "in": "events"}]},
     "service mail keeps no list 'events'; its lists: messages, audit"),
    ({"services": {"mail": {}}, "checks": [{"service": "mail", "in": "messages", "where": {"to": {"has": 1}}}]},
     "has takes an object"),
    ({"services": {"mail": {"faults": {"actions": ["explode"]}}}, "checks": [{"service": "mail", "in": "messages"}]},
     "faults.actions names no action of it: explode"),
    ({"services": {"notes": {"smtp": True}}, "checks": [{"service": "notes", "in": "notes"}]},
     "only mail has an SMTP door"),
    ({"services": {"mail": {}}, "checks": []}, "checks"),
])
def test_the_task_spec_refuses_what_would_fail_in_the_sandbox(spec, says):
    with pytest.raises(ValueError, match=says):
        ClawSpec.model_validate(spec)
