"""`serve`: run the orchestrator's REST API with uvicorn (what `orchard serve` calls)."""

from __future__ import annotations

from pathlib import Path

import uvicorn

from orchard.core.backend import BackendConfig
from orchard.core.pool import PoolsConfig
from orchard.core.errors import InvalidRequest
from orchard.sandbox.backends.registry import create_backend
from orchard.sandbox.server.admission import CreateCaps
from orchard.sandbox.server.api_keys import KeyRing, keys_file
from orchard.sandbox.server.app import create_app
from orchard.sandbox.server.home import resolve_home, resolved_backend_config, state_db_path
from orchard.sandbox.server.service import SandboxService
from orchard.sandbox.server.spec_limits import SpecLimits, spec_limits
from orchard.sandbox.server.store import SandboxStore
from orchard.util.connection_guard import ConnectionGuard, ConnectionLimits, guarded_h11
from orchard.util.chunk_limit import chunk_limited_h11
from orchard.util.logs import log_to_stderr


def serve(host: str = "127.0.0.1", port: int = 8700, backend: BackendConfig | str = "local", api_key: str | None = None,
          home: str | Path | None = None, *, reap_interval_s: float = 2.0, log_level: str = "info",
          limits: SpecLimits | None = None, caps: CreateCaps | None = None,
          pools: PoolsConfig | None = None, api_keys_file: Path | None = None,
          connections: ConnectionLimits | None = None) -> None:
    """Serve until SIGINT/SIGTERM. State lives under `home` (default `$ORCHARD_HOME`, else `~/.orchard`);
    sandboxes outlive the server and are re-adopted by the next one on the same home. `limits`: the most a
    spec may ask for (default: this machine's, overridable by ORCHARD_MAX_*; see spec_limits.py). `backend`:
    a config, or a backend's name with its defaults (see orchard/sandbox/backends/registry.py). `caps`: the
    most live sandboxes in all and per owner, and the create rate (see admission.py; default none).
    `pools`: warm pools of pre-started sandboxes (see pools.py, docs/pools.md). `api_keys_file`: the owner
    keys (api_keys.py; default `<home>/api-keys.json`). `connections`: the caps and request deadline on
    client connections (orchard/util/connection_guard.py; default: half the process's descriptors, 30 s)."""
    if not api_key:
        raise InvalidRequest("an API key is required: clients must send 'Authorization: Bearer <api key>'")
    log_to_stderr(log_level)
    home = resolve_home(home)
    config = resolved_backend_config(backend, home)
    if limits is None:
        limits = spec_limits(config, home)
    keys = KeyRing(api_keys_file or keys_file(home))  # a broken key file stops the start, said plainly
    service = SandboxService(create_backend(config), SandboxStore(state_db_path(home)), reap_interval_s=reap_interval_s,
                             limits=limits, caps=caps, pools=pools)
    app = create_app(service, api_key, keys=keys)
    # h11 (never httptools, whatever is installed) with the connection guard: slow or idle clients cannot hold
    # the server's descriptors; a chunk over the body limit is refused as soon as it is declared.
    uvicorn.run(app, host=host, port=port, access_log=False, log_level=log_level, timeout_graceful_shutdown=10,
                http=chunk_limited_h11(guarded_h11(ConnectionGuard(connections))))
