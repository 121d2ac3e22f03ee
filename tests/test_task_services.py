"""Task services end to end through the real evaluator (react, the scripted model, the local backend as
root): a task whose mail service the agent uses over HTTP and whose services grader reads the service's
state and its /audit log; a no-op fails it; a service that does not start, never gets ready, or dies
during the run is the environment's error naming it with its log, and no sandbox is left behind."""

from __future__ import annotations

import json

import pytest

from orchard.core.task import ServicesGrader, Task, TaskEnvironment, TaskFile, TaskService
from orchard.core.task_suite import TaskSuite
from tests.harness_rig import SCRIPTED, scripted_config, tool_calls
from tests.test_eval import evaluate, trajectories

# A tiny mail service: POST /send keeps the message in its state directory, GET /audit lists the calls.
MAIL = r"""
import http.server, os, sys
state = os.environ["ORCHARD_SERVICE_STATE"]
class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(os.path.join(state, "outbox.jsonl"), "ab") as f:
            f.write(body + b"\n")
        with open(os.path.join(state, "audit.log"), "a") as f:
            f.write("POST %s\n" % self.path)
        self._answer(b"sent")
    def do_GET(self):
        if self.path == "/audit":
            path = os.path.join(state, "audit.log")
            self._answer(open(path, "rb").read() if os.path.exists(path) else b"")
        else:
            self._answer(b"ok")
    def log_message(self, *args):
        sys.stderr.write("mail: " + (args[0] % args[1:]) + "\n")
print("mail service up", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
SEND = ("python3 -c \"import os, urllib.request; urllib.request.urlopen(os.environ['ORCHARD_SERVICE_MAIL_URL'] "
        "+ '/send', data=b'{\\\"to\\\": \\\"bob\\\", \\\"body\\\": \\\"hello\\\"}')\"")
CHECK = ("grep -q bob \"$ORCHARD_SERVICE_MAIL_STATE/outbox.jsonl\" && python3 -c \"import os, urllib.request; "
         "print(urllib.request.urlopen(os.environ['ORCHARD_SERVICE_MAIL_URL'] + '/audit').read().decode())\" "
         "| grep -q 'POST /send'")


def mail_task(service: TaskService | None = None) -> Task:
    service = service or TaskService(name="mail", command="python3 /tmp/mail.py 8025", port=8025,
                                     health_check="/health")
    return Task(id="send-mail", instruction="Send bob a mail saying hello through the mail service.",
                environment=TaskEnvironment(image="host", workdir="/workspace", services=[service],
                                            files=[TaskFile(path="/tmp/mail.py", content=MAIL)]),
                grader=ServicesGrader(script=CHECK))


@pytest.fixture
def home(sandbox_home):
    return sandbox_home


async def run(home, out, scripted, task: Task, replies: list) -> list:
    scripted.load(replies)
    await evaluate(home, out, model=SCRIPTED, config=scripted_config(scripted), tasks=None,
                   suite=TaskSuite(name="services-suite", tasks=[task]))
    return trajectories(out)


async def test_the_agent_uses_the_service_and_the_grader_reads_its_state(home, tmp_path, scripted):
    (done,) = await run(home, tmp_path / "run", scripted, mail_task(),
                        [tool_calls(("bash", {"command": SEND})), tool_calls(("submit", {}))])
    assert done.outcome.resolved and done.outcome.reward == 1.0, done.outcome
    log = (tmp_path / "run" / done.extra["service_logs"]["mail"]).read_text()
    assert "mail service up" in log and '"POST /send HTTP/1.1" 200' in log
    (noop,) = await run(home, tmp_path / "noop", scripted, mail_task(), [tool_calls(("submit", {}))])
    assert noop.outcome.resolved is False and noop.outcome.error is None and noop.exit_status == "submitted"


async def test_the_agent_cannot_forge_the_service_state(home, tmp_path, scripted):
    forge = ("mkdir -p /tmp/fake && echo '{\"to\": \"bob\"}' > /tmp/fake/outbox.jsonl; "
             "ls /.orchard/run/services/mail; echo 'POST /send' >> /.orchard/run/services/mail/audit.log")
    (forged,) = await run(home, tmp_path / "run", scripted, mail_task(),
                          [tool_calls(("bash", {"command": forge})), tool_calls(("submit", {}))])
    assert forged.outcome.resolved is False, forged.outcome
    assert "Permission denied" in json.dumps(forged.model_dump(mode="json")["steps"])


@pytest.mark.parametrize("service, named", [
    (TaskService(name="mail", command="no-such-mail-server --port 8025", port=8025),
     ["service mail ended before it was ready (exit status 127); its log ends: ", "no-such-mail-server"]),
    (TaskService(name="mail", command="echo listening elsewhere; sleep 600", port=8025, ready_timeout_s=1),
     ["service mail was not ready within 1 s (nothing listens on port 8025); its log ends: listening elsewhere"]),
    (TaskService(name="mail", command="python3 -m http.server 8025 --bind 127.0.0.1", port=8025,
                 health_check="/no-such-page", ready_timeout_s=2),
     ["service mail was not ready within 2 s (GET /no-such-page answered 'HTTP/1.0 404 File not found')"]),
    (TaskService(name="mail", command="python3 /tmp/mail.py 8025", port=8025, health_check="/health"), None),
], ids=["command-missing", "never-listens", "unhealthy", "control"])
async def test_a_service_that_does_not_get_ready_is_an_environment_error(home, tmp_path, scripted, service, named):
    (trajectory,) = await run(home, tmp_path / "run", scripted, mail_task(service), [tool_calls(("submit", {}))])
    if named is None:  # the control: the same task with a working service is a plain failed attempt
        assert trajectory.outcome.error is None and trajectory.outcome.resolved is False
        return
    assert trajectory.exit_status == "environment_error", trajectory.outcome
    assert all(part in trajectory.outcome.error for part in named), trajectory.outcome.error


async def test_a_port_already_taken_is_an_environment_error_naming_the_service(home, tmp_path, scripted):
    """Taken by the task's own setup: the port would pass for the service's readiness, so it is refused
    before the services start. Two services declaring one port are refused when the task is read."""
    task = mail_task()
    task.environment.setup.append("python3 -m http.server 8025 --bind 127.0.0.1 </dev/null >/dev/null 2>&1 & "
                                  "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection("
                                  "(\"127.0.0.1\", 8025))' 2>/dev/null && break; sleep 0.1; done")
    (trajectory,) = await run(home, tmp_path / "run", scripted, task, [tool_calls(("submit", {}))])
    assert trajectory.exit_status == "environment_error", trajectory.outcome
    assert ("task send-mail: port 8025 of service mail is already taken in the sandbox before the services "
            "start") in trajectory.outcome.error
    with pytest.raises(ValueError, match="services mail and impostor both listen on port 8025"):
        TaskEnvironment(services=[*task.environment.services,
                                  TaskService(name="impostor", command="true", port=8025)])


async def test_a_service_that_dies_during_the_run_is_an_environment_error(home, tmp_path, scripted):
    dying = TaskService(name="mail", command="echo about to go; sleep 0.5; exit 4")
    (trajectory,) = await run(home, tmp_path / "run", scripted, mail_task(dying),
                              [tool_calls(("bash", {"command": "sleep 2"})), tool_calls(("submit", {}))])
    assert trajectory.exit_status == "environment_error", trajectory.outcome
    assert "service mail ended during the run (exit status 4); its log ends: about to go" in trajectory.outcome.error
    assert (tmp_path / "run" / trajectory.extra["service_logs"]["mail"]).read_text() == "about to go\n"


def test_the_docs_examples_are_valid_and_run(embedded_home, capsys):
    """docs/services.md: the task declaration is a valid Task; the SDK example runs as written."""
    from tests import doc_blocks

    page = doc_blocks.ROOT / "docs" / "services.md"
    (task,) = doc_blocks.check_data_blocks(page, "json")
    assert task.environment.sandbox_spec().services and task.grader.kind == "services"
    ((_, code, line),) = doc_blocks.of_kind(page, "python")
    doc_blocks.run_python(code, f"services.md:{line}", {})
    assert capsys.readouterr().out == "True a private note\n"
