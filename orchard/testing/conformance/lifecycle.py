"""Lifecycle: create, find, delete, refusal of what a backend lacks, TTL."""

from __future__ import annotations

import pytest

from orchard.core.backend import LIMIT_NAMES
from orchard.core.errors import InvalidRequest, SandboxLost
from orchard.core.sandbox import NetworkPolicy, SandboxInfo, SandboxSpec
from orchard.testing.conformance._rig import ConformanceRig, wait_until


class LifecycleChecks(ConformanceRig):
    def test_create_returns_a_ready_sandbox_found_by_label_and_by_the_backend(self, orchestrator, shared):
        info, sandbox = shared
        backend = orchestrator.backend
        assert info.state == "ready" and info.backend == backend.name
        assert info.agent_url and info.token
        assert orchestrator.run(orchestrator.service.get(info.id)).state == "ready"
        listed = orchestrator.run(orchestrator.service.list(labels={"conformance": "shared"}))
        assert [i.id for i in listed] == [info.id]
        assert orchestrator.run(orchestrator.service.list(labels={"conformance": "no-such-label"})) == []
        live = {found.id: found for found in orchestrator.run(backend.list_live())}
        assert info.id in live and live[info.id].agent_url == info.agent_url
        assert orchestrator.run(backend.is_alive(live[info.id]))
        assert sandbox.exec("echo ready").stdout == "ready\n"

    def test_delete_removes_everything_and_is_idempotent(self, orchestrator):
        info = orchestrator.create(self._spec_for(orchestrator))
        made = orchestrator.service.store.get(info.id).backend
        client = orchestrator.attach(info)
        assert client.exec("sleep 300 >/dev/null 2>&1 & echo started").stdout == "started\n"
        orchestrator.run(orchestrator.service.delete(info.id))
        assert orchestrator.run(orchestrator.service.get(info.id)).state == "deleted"
        assert info.id not in orchestrator.live_ids()
        assert not orchestrator.run(orchestrator.backend.is_alive(made))
        with pytest.raises(SandboxLost):
            client.exec("true")
        client.close()
        orchestrator.run(orchestrator.service.delete(info.id))  # deleting again does nothing
        orchestrator.run(orchestrator.backend.delete(made))  # nor does the backend's own delete, again
        assert info.id not in orchestrator.live_ids()

    def test_a_bad_spec_is_invalid_and_leaves_nothing(self, orchestrator):
        before = {i.id for i in orchestrator.run(orchestrator.service.list())}
        live_before = orchestrator.live_ids()
        with pytest.raises(InvalidRequest, match="workdir"):
            orchestrator.create({"image": self.image, "workdir": "relative/path"})
        kinds = orchestrator.backend.capabilities.image_kinds
        missing = ("localhost/orchard-conformance-no-such-image:nope" if "oci" in kinds
                   else "/nonexistent/orchard-conformance-rootfs" if "rootfs" in kinds else None)
        if missing is not None:
            with pytest.raises(InvalidRequest):
                orchestrator.create(self._spec_for(orchestrator, image=missing))
        assert {i.id for i in orchestrator.run(orchestrator.service.list())} == before
        assert orchestrator.live_ids() == live_before

    def test_what_the_backend_lacks_is_refused_naming_it(self, orchestrator):
        capabilities, name = orchestrator.backend.capabilities, orchestrator.backend.name
        lacking: dict[str, SandboxSpec] = {}
        for mode in ("none", "allowlist", "open"):
            if mode not in capabilities.network_modes:
                allow = ["192.0.2.1"] if mode == "allowlist" else []
                lacking[mode] = self._spec_for(orchestrator, network=NetworkPolicy(mode=mode, allow=allow))
        values = {"cpu": 1.0, "memory_mb": 256, "disk_mb": 256, "max_processes": 256}
        for limit in LIMIT_NAMES:
            if limit not in capabilities.limits:
                lacking[limit] = self._spec_for(orchestrator, **{limit: values[limit]})
        examples = {"host": "host", "rootfs": "/nonexistent/orchard-conformance-rootfs",
                    "oci": "localhost/orchard-conformance:none"}
        for kind, image in examples.items():
            if kind not in capabilities.image_kinds:
                lacking[f"images of kind {kind!r}"] = self._spec_for(orchestrator, image=image)
        if not lacking:
            pytest.skip(f"the {name} backend declares every network mode, limit and image kind")
        live_before = orchestrator.live_ids()
        for what, spec in lacking.items():
            with pytest.raises(InvalidRequest, match=f"the {name} backend") as refused:
                orchestrator.create(spec)
            assert what in str(refused.value), (what, str(refused.value))
        assert orchestrator.live_ids() == live_before

    def test_a_sandbox_past_its_ttl_is_deleted_by_the_reaper(self, orchestrator):
        info = orchestrator.create(self._spec_for(orchestrator, timeout_s=2))

        def gone() -> SandboxInfo | None:
            now = orchestrator.run(orchestrator.service.get(info.id))
            return now if now.state == "deleted" else None

        deleted = wait_until(gone, "the reaper to delete a sandbox past its TTL")
        assert "TTL" in (deleted.error or "")
        assert info.id not in orchestrator.live_ids()
