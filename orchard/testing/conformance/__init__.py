"""The backend conformance suite: what every Orchard backend must do, checked on real sandboxes through the
real orchestrator (`SandboxService` on a `SandboxStore`) and the real agent client.

A backend runs it by subclassing `BackendConformance` in a test module and giving it one fixture,
`make_backend_config`: a function from a fresh state directory to a config of the backend under test. Each
call must give a config whose sandboxes no other call's backend sees (`list_live`), because each call
starts an orchestrator of its own, and an orchestrator deletes what its backend runs and its store does not
know. The local backend's (tests/conformance/test_local.py) is the whole of it:

    class TestLocalBackend(BackendConformance):
        @pytest.fixture(scope="class")
        def make_backend_config(self):
            return lambda home: backend_config("local", home)

Class attributes say what the sandboxes run on: `image` (default "host"; an OCI backend names an image with
a POSIX shell, busybox or coreutils, and python3, nc or bash for the network tests), `max_processes` and
`memory_mb` (what the limit tests ask for). The Docker backend's module, tests/conformance/test_docker.py,
is as short: an `image`, and a `make_backend_config` giving each orchestrator an `instance` label of its
own (after skipping without a daemon, or failing with ORCHARD_DOCKER=1).

The checks live one area to a module (lifecycle, execs, files, isolation, model network, ports, services,
limits, restart) on the shared fixtures of `_rig.py`; `BackendConformance` is all of them. See docs/conformance.md.

A test is skipped only where the backend's `capabilities` say it lacks the thing tested (a network mode,
a limit); asking for what it lacks must then be refused with InvalidRequest naming the backend, which is
tested too. The tests are synchronous: the orchestrator and the sandboxes' clients run on an event loop
of the suite's own, so the suite needs no pytest-asyncio configuration."""

from orchard.testing.conformance._rig import ConformanceRig, Orchestrator
from orchard.testing.conformance.execs import ExecChecks
from orchard.testing.conformance.files import FileChecks
from orchard.testing.conformance.isolation import IsolationChecks
from orchard.testing.conformance.lifecycle import LifecycleChecks
from orchard.testing.conformance.limits import LimitChecks
from orchard.testing.conformance.model_network import ModelNetworkChecks
from orchard.testing.conformance.ports import PortChecks
from orchard.testing.conformance.restart import RestartChecks
from orchard.testing.conformance.services import ServiceChecks


class BackendConformance(LifecycleChecks, ExecChecks, FileChecks, IsolationChecks, ModelNetworkChecks, PortChecks,
                         ServiceChecks, LimitChecks, RestartChecks):
    """Subclass in a test module (named Test...) and provide the `make_backend_config` fixture."""


__all__ = ["BackendConformance", "ConformanceRig", "Orchestrator"]
