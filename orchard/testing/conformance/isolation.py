"""Isolation: host files, other sandboxes' tokens, network modes none / open / allowlist."""

from __future__ import annotations

import secrets

import pytest

from orchard.core.errors import AuthError
from orchard.core.sandbox import NetworkPolicy
from orchard.testing.conformance._rig import (
    PUBLIC_ADDRESS,
    ConformanceRig,
    host_address,
    host_address_for_mode,
    probe_tcp,
    tcp_server,
)


class IsolationChecks(ConformanceRig):
    def test_host_files_outside_the_sandbox_are_invisible(self, orchestrator, sandbox, tmp_path):
        """A file in the test's own temporary directory (pytest's, private to this user), and the
        orchestrator's store."""
        secret = f"host-secret-{secrets.token_hex(8)}"
        (tmp_path / "secret.txt").write_text(secret)
        state = orchestrator.home / "state.db"  # the orchestrator's store: it holds every sandbox's token
        for path in (tmp_path / "secret.txt", state):
            r = sandbox.exec(f"cat {path}")
            assert r.exit_code != 0 and secret not in r.stdout and r.stdout == "", (path, r)
        r = sandbox.exec(f"ls {tmp_path}")
        assert r.exit_code != 0 and "secret.txt" not in r.stdout

    def test_another_sandboxs_token_is_refused(self, orchestrator, shared):
        info, _ = shared
        with orchestrator.sandbox(self._spec_for(orchestrator)) as (other, _):
            assert other.token != info.token
            crossed = orchestrator.attach(info.model_copy(update={"token": other.token}))
            try:
                with pytest.raises(AuthError):
                    crossed.exec("echo should-not-run")
            finally:
                crossed.close()

    def test_network_none_reaches_nothing_outside(self, orchestrator, sandbox, shared):
        info, _ = shared
        assert info.spec.network.mode == "none"
        address = host_address()
        with tcp_server() as port:
            targets = [(address, port)] if address else []
            for host, target_port in [*targets, PUBLIC_ADDRESS]:
                connected, output = probe_tcp(sandbox, host, target_port)
                assert not connected, f"network 'none' reached {host}:{target_port}: {output}"

    def test_network_open_reaches_a_server_on_the_host(self, orchestrator):
        address = host_address_for_mode(orchestrator, "open")
        with tcp_server() as port, orchestrator.sandbox(
                self._spec_for(orchestrator, network=NetworkPolicy(mode="open"))) as (_, sandbox):
            connected, output = probe_tcp(sandbox, address, port)
            assert connected, f"network 'open' did not reach {address}:{port} on the host: {output}"

    def test_network_allowlist_reaches_only_what_it_allows(self, orchestrator):
        address = host_address_for_mode(orchestrator, "allowlist")
        with tcp_server() as allowed, tcp_server() as other:
            spec = self._spec_for(orchestrator, network=NetworkPolicy(mode="allowlist",
                                                                      allow=[f"{address}:{allowed}"]))
            with orchestrator.sandbox(spec) as (_, sandbox):
                connected, output = probe_tcp(sandbox, address, allowed)
                assert connected, f"network 'allowlist' did not reach the allowed {address}:{allowed}: {output}"
                connected, output = probe_tcp(sandbox, address, other)
                assert not connected, f"network 'allowlist' reached {address}:{other}, not allowed: {output}"
