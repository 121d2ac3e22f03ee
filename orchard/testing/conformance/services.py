"""Task services (`spec.services`): where the backend declares them, a service runs under a user of its own
that the sandbox's commands can neither signal nor read, with its state in a directory they can neither
enter, rename nor remove, its log kept and its end reported; a check run as the services' user reads
that state. Where the backend does not declare them, a spec asking for them is refused, naming the
backend, and a sandbox without them refuses to start a service."""

from __future__ import annotations

from typing import Iterator

import pytest

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import ServiceStart
from orchard.sandbox.sync import SyncSandbox
from orchard.testing.conformance._rig import ConformanceRig, wait_until

# A service that keeps a secret in its state and runs until killed.
KEEPER = "echo 'the state' > data.txt; echo started; while :; do sleep 1; done"
# A one-file HTTP server answering every GET with the status given as argv[2], on the port in argv[1].
ANSWERING = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(int(sys.argv[2]))
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


class ServiceChecks(ConformanceRig):
    @pytest.fixture(scope="class")
    def serving(self, orchestrator) -> Iterator[SyncSandbox]:
        if not orchestrator.backend.capabilities.services:
            pytest.skip(f"the {orchestrator.backend.name} backend does not declare task services")
        with orchestrator.sandbox(self._spec_for(orchestrator, services=True)) as (_, sandbox):
            sandbox.write_file("/tmp/seed/greeting.txt", "seeded")
            sandbox.start_service(ServiceStart(name="keeper", command=KEEPER, seed_dir="/tmp/seed"))
            wait_until(lambda: "started" in sandbox.services()[0].log, "the service's first output")
            yield sandbox

    def test_a_service_is_out_of_the_commands_reach(self, serving):
        (service,) = serving.services()
        assert service.running and service.name == "keeper"
        r = serving.exec(f"kill -9 {service.pid}; echo kill=$?; cat {service.state_dir}/data.txt; echo cat=$?; "
                         f"rm -rf {service.state_dir}; mv {service.state_dir} /tmp/moved; echo mv=$?; "
                         f"touch {service.state_dir}/forged; echo touch=$?")
        assert "the state" not in r.stdout, r.stdout
        for step in ("cat", "mv", "touch"):
            assert f"{step}=0" not in r.stdout, r.stdout
        assert serving.services()[0].running

    def test_a_check_as_the_services_user_reads_their_state(self, serving):
        (service,) = serving.services()
        r = serving.exec_as_service(f"cat {service.state_dir}/data.txt {service.state_dir}/greeting.txt")
        assert r.exit_code == 0 and r.stdout == "the state\nseeded", r

    def test_a_service_that_ends_is_reported_with_its_log(self, serving):
        serving.start_service(ServiceStart(name="short-lived", command="echo going away; exit 3"))
        ended = wait_until(lambda: [s for s in serving.services() if s.name == "short-lived" and not s.running],
                           "the service's end")
        assert ended[0].exit_code == 3 and "going away" in ended[0].log

    def test_bad_services_are_refused(self, serving):
        with pytest.raises(InvalidRequest, match="started already"):
            serving.start_service(ServiceStart(name="keeper", command="true"))
        with pytest.raises(InvalidRequest, match="no service named 'nobody'"):
            serving.wait_services(["nobody"], timeout=1)

    def test_waiting_for_services_to_be_ready(self, serving):
        """The agent waits for each port and then its health check: a healthy service is ready, one
        whose check answers 500 or that never listens is not (saying why), at the timeout."""
        serving.write_file("/tmp/answering.py", ANSWERING)
        for name, port, status in (("healthy", 8301, 200), ("failing", 8302, 500)):
            serving.start_service(ServiceStart(name=name, command=f"exec python3 /tmp/answering.py {port} {status}",
                                               port=port, health_check="/health"))
        serving.start_service(ServiceStart(name="deaf", command="exec sleep 600", port=8303))
        (healthy,) = serving.wait_services(["healthy"], timeout=30)
        assert healthy.ready and healthy.running and healthy.not_ready is None, healthy
        waited = {s.name: s for s in serving.wait_services(["healthy", "failing", "deaf"], timeout=3)}
        assert waited["healthy"].ready
        assert not waited["failing"].ready and "GET /health answered" in waited["failing"].not_ready
        assert "500" in waited["failing"].not_ready
        assert not waited["deaf"].ready and waited["deaf"].not_ready == "nothing listens on port 8303"

    def test_a_wait_ends_when_a_service_ends(self, serving):
        serving.start_service(ServiceStart(name="crashing", command="echo no config; exit 2", port=8304))
        (crashed,) = serving.wait_services(["crashing"], timeout=60)  # answered at its end, not the timeout
        assert not crashed.running and not crashed.ready and crashed.exit_code == 2

    def test_services_need_a_spec_that_asks_for_them(self, orchestrator, sandbox):
        with pytest.raises(InvalidRequest, match="services"):
            sandbox.start_service(ServiceStart(name="any", command="true"))
        if orchestrator.backend.capabilities.services:
            return
        before = orchestrator.live_ids()
        with pytest.raises(InvalidRequest, match=f"{orchestrator.backend.name} backend .*task services"):
            orchestrator.create(self._spec_for(orchestrator, services=True))
        assert orchestrator.live_ids() == before
