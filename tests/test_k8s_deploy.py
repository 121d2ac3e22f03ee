"""The orchestrator deployed in the cluster (deploy/k8s/), end to end on the dev cluster: build and import
its image (scripts/k8s/orchard-image.sh: ~11 s cold, well under a second when cached), apply the
manifests, wait for the Deployment, then — from the host, at the orchestrator's Pod IP, with the API key —
create a sandbox through the SDK and exec in it; the orchestrator reaches the API server through the
`kubernetes` Service from inside its Pod. Everything applied is deleted afterwards."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from orchard.core.errors import AuthError
from tests.k8s_cluster import REPO, dev_cluster_kubeconfig, require_cluster

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

IMAGE_SCRIPT = REPO / "scripts" / "k8s" / "orchard-image.sh"
MANIFESTS = REPO / "deploy" / "k8s"
SYSTEM_NS, SANDBOX_NS = "orchard-system", "orchard-sandboxes"
BASE_IMAGE = "localhost/orchard-base:local"


def _kubectl(kubeconfig: str, *args: str, timeout: float = 120) -> str:
    result = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout


def _skip_unless_dev_cluster(kubeconfig: str) -> None:
    """The image goes into the dev cluster's containerd (no registry): another cluster would not have it."""
    if os.geteuid() != 0:
        pytest.skip("importing the orchestrator image into the dev cluster's containerd needs root")
    dev = dev_cluster_kubeconfig()
    if not dev.is_file() or Path(kubeconfig).resolve() != dev.resolve():
        pytest.skip("the deployment test imports its images into the dev cluster (scripts/k8s/cluster.sh); "
                    f"KUBECONFIG={kubeconfig} is another cluster: push the images to its registry instead")
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (cluster.sh up installs it)")


async def test_in_cluster_orchestrator_serves_sandboxes():
    from orchard.sandbox.client import AsyncOrchard
    kubeconfig = require_cluster()
    _skip_unless_dev_cluster(kubeconfig)
    namespaces = _kubectl(kubeconfig, "get", "namespaces", "-o", "name").split()
    if f"namespace/{SYSTEM_NS}" in namespaces:
        pytest.skip(f"namespace {SYSTEM_NS} exists: an orchestrator is already deployed there, and this test "
                    "would replace and then delete it")

    build = subprocess.run(["bash", str(IMAGE_SCRIPT)], capture_output=True, text=True, timeout=240)
    assert build.returncode == 0, f"orchard-image.sh failed:\n{build.stdout[-2000:]}\n{build.stderr[-3000:]}"

    key = secrets.token_urlsafe(24)
    try:
        _kubectl(kubeconfig, "apply", "-k", str(MANIFESTS))
        _kubectl(kubeconfig, "-n", SYSTEM_NS, "create", "secret", "generic", "orchard-api-key",
                 f"--from-literal=key={key}")
        _kubectl(kubeconfig, "-n", SYSTEM_NS, "rollout", "status", "deployment/orchard", "--timeout=120s",
                 timeout=130)
        pod_ip = _kubectl(kubeconfig, "-n", SYSTEM_NS, "get", "pods", "-l", "app.kubernetes.io/name=orchard",
                          "--field-selector=status.phase=Running", "-o",
                          "jsonpath={.items[0].status.podIP}").strip()
        assert pod_ip.startswith("10.244."), pod_ip
        url = f"http://{pod_ip}:8700"

        async with AsyncOrchard(url, "not-the-key") as stranger:
            with pytest.raises(AuthError):
                await stranger.list()
        async with AsyncOrchard(url, key) as orch:
            sb = await orch.create(image=BASE_IMAGE, cpu=0.5, memory_mb=128)
            info = await orch.get(sb.id)
            assert info.backend == "kubernetes" and info.state == "ready"
            pods = _kubectl(kubeconfig, "-n", SANDBOX_NS, "get", "pods", "-l", f"orchard.dev/sandbox={sb.id}",
                            "-o", "name").split()
            assert pods == [f"pod/orchard-{sb.id}"]
            assert (await sb.exec("echo $((6*7)) $(hostname)")).stdout == f"42 {sb.id}\n"
            await orch.delete(sb.id)
            listing = _kubectl(kubeconfig, "-n", SANDBOX_NS, "get", "pods,secrets", "-l",
                               f"orchard.dev/sandbox={sb.id}", "-o", "jsonpath={range .items[*]}"
                               "{.metadata.name}={.metadata.deletionTimestamp}{\"\\n\"}{end}")
            assert [line for line in listing.splitlines() if line.endswith("=")] == []  # none not being deleted
    finally:
        # Pods at once (grace 0): the namespace controller would otherwise wait for their grace periods.
        for ns in (SYSTEM_NS, SANDBOX_NS):
            subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "-n", ns, "delete", "pods", "--all",
                            "--grace-period=0", "--force"], capture_output=True, timeout=60)
        _kubectl(kubeconfig, "delete", "-k", str(MANIFESTS), "--ignore-not-found", "--wait=true",
                 "--timeout=120s", timeout=130)
    names = _kubectl(kubeconfig, "get", "namespaces,clusterroles,clusterrolebindings", "-o", "name").split()
    assert not [n for n in names if n.split("/")[1] in (SYSTEM_NS, SANDBOX_NS, "orchard-node-reader")]
