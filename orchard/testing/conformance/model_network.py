"""Model-only networking: with `network.mode = "model"` the orchestrator's model gateway answers at
127.0.0.1:4000 inside the sandbox and nothing else is reachable; without a configured gateway the spec is
refused.

The rig serves a real gateway app (orchard.gateway, no models: only its /healthz is asked for, so litellm
is never loaded) on a Unix socket in a private directory and on a TCP port of every host address, and
starts one more orchestrator on the backend's config with `model_gateway` set: the socket (`unix:/PATH`)
for a backend whose sandboxes run on this machine (`runs_here`), else `http://<this machine's
address>:<port>`. Skipped where that config still does not declare the capability."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from orchard.core.backend import BackendConfig
from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import NetworkPolicy
from orchard.testing.conformance._rig import (
    PUBLIC_ADDRESS,
    ConformanceRig,
    Orchestrator,
    host_address,
    probe_tcp,
    tcp_server,
)

# GETs http://127.0.0.1:4000$1 from inside with whatever the image has; prints the response body. Not
# wget: a static busybox's crashed resolving even a numeric address in an image without a libc.
HTTP_PROBE = """
url="http://127.0.0.1:4000$1"
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$url"
elif command -v curl >/dev/null 2>&1; then
  curl -s -m 10 "$url"
elif command -v nc >/dev/null 2>&1; then
  printf 'GET %s HTTP/1.0\r\nHost: gateway\r\n\r\n' "$1" | nc -w 10 127.0.0.1 4000
else
  echo "NO-PROBE: the image has none of python3, curl or nc to make an HTTP request"; exit 99
fi
"""


class ModelNetworkChecks(ConformanceRig):
    @pytest.fixture(scope="class")
    def gateway_orchestrator(self, make_backend_config, loop, tmp_path_factory) -> Iterator[Orchestrator]:
        from orchard.gateway.app import create_app
        from orchard.gateway.gateway import Gateway
        from orchard.util.uvicorn_thread import ServerThread

        with tempfile.TemporaryDirectory(prefix="orchard-gw-") as private:  # 0700: the socket is 0666
            socket_path = Path(private) / "gateway.sock"
            with ServerThread(create_app(Gateway()), host="0.0.0.0", what="the model gateway",
                              unix_socket=socket_path, unix_socket_mode=0o666, lifespan="off") as server:
                home = tmp_path_factory.mktemp("orchard-home")
                config = make_backend_config(home)
                if type(config).runs_here:
                    where = f"unix:{socket_path}"
                else:
                    address = host_address()
                    if address is None:
                        pytest.skip("this machine has no non-loopback IPv4 address for the gateway")
                    where = f"http://{address}:{server.port}"
                orchestrator = Orchestrator(_with_gateway(config, where), home, loop)
                try:
                    if not orchestrator.backend.capabilities.model_gateway:
                        pytest.skip(f"the {orchestrator.backend.name} backend does not declare the model "
                                    f"gateway, even with model_gateway={where}")
                    yield orchestrator
                finally:
                    orchestrator.stop(delete_all=True)

    def test_model_network_reaches_the_gateway_and_nothing_else(self, gateway_orchestrator):
        spec = self._spec_for(gateway_orchestrator, network=NetworkPolicy(mode="model"))
        with gateway_orchestrator.sandbox(spec) as (_, sandbox):
            r = sandbox.exec(["sh", "-c", HTTP_PROBE, "probe", "/healthz"], timeout=60)
            assert r.exit_code != 99, r.stdout
            assert r.exit_code == 0 and '"status":"ok"' in r.stdout.replace(" ", ""), r
            address = host_address()
            with tcp_server() as port:
                for host, target_port in [*([(address, port)] if address else []), PUBLIC_ADDRESS]:
                    connected, output = probe_tcp(sandbox, host, target_port)
                    assert not connected, f"network 'model' reached {host}:{target_port}: {output}"

    def test_a_model_network_without_a_gateway_is_refused(self, orchestrator):
        if orchestrator.backend.capabilities.model_gateway:
            pytest.skip("the backend's own config has a model gateway")
        before = orchestrator.live_ids()
        with pytest.raises(InvalidRequest, match="model gateway"):
            orchestrator.create(self._spec_for(orchestrator, network=NetworkPolicy(mode="model")))
        assert orchestrator.live_ids() == before


def _with_gateway(config: BackendConfig, where: str) -> BackendConfig:
    return type(config).model_validate({**config.model_dump(), "model_gateway": where})
