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

    def test_services_need_a_spec_that_asks_for_them(self, orchestrator, sandbox):
        with pytest.raises(InvalidRequest, match="services"):
            sandbox.start_service(ServiceStart(name="any", command="true"))
        if orchestrator.backend.capabilities.services:
            return
        before = orchestrator.live_ids()
        with pytest.raises(InvalidRequest, match=f"{orchestrator.backend.name} backend .*task services"):
            orchestrator.create(self._spec_for(orchestrator, services=True))
        assert orchestrator.live_ids() == before
