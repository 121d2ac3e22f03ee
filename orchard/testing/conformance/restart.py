"""Re-adoption: a restarted orchestrator takes its sandboxes back and removes orphans."""

from __future__ import annotations

import secrets

from orchard.sandbox.backends.registry import create_backend
from orchard.sandbox.server.create_steps import new_sandbox_id
from orchard.testing.conformance._rig import ConformanceRig, Orchestrator, live_ids_of


class RestartChecks(ConformanceRig):
    def test_a_restarted_orchestrator_readopts_its_sandboxes_and_removes_orphans(self, new_orchestrator):
        first = new_orchestrator()
        kept = first.create(self._spec_for(first, labels={"conformance": "kept"}))
        first.stop(delete_all=False)  # the orchestrator goes; its sandboxes stay
        orphan_id = new_sandbox_id()

        async def make_orphan() -> None:  # a sandbox its backend runs but no store knows
            backend = create_backend(first.config)
            try:
                await backend.create(orphan_id, self._spec_for(first), secrets.token_urlsafe(16))
            finally:
                await backend.close()

        first.run(make_orphan())
        second = Orchestrator(first.config, first.home, first.loop)  # a new backend on the same config
        try:
            assert second.report.adopted == [kept.id]
            assert second.report.orphans_removed == [orphan_id]
            assert second.live_ids() == {kept.id}
            info = second.run(second.service.get(kept.id))
            assert info.state == "ready" and info.token == kept.token and info.agent_url == kept.agent_url
            client = second.attach(info)
            try:
                assert client.exec("echo still here").stdout == "still here\n"
            finally:
                client.close()
        finally:
            second.stop(delete_all=True)
        assert first.run(live_ids_of(first.config)) == set()
