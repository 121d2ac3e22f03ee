"""Finding the Kubernetes cluster the `k8s` tests run against: $KUBECONFIG, else the dev cluster of
scripts/k8s/cluster.sh (its kubeconfig in ${ORCHARD_K8S_DIR:-~/.orchard/k8s}). Without a reachable
cluster the tests are skipped, unless ORCHARD_K8S=1 says one must be there: then they fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "scripts" / "k8s" / "cluster.sh"
# The dev cluster's kubelet podPidsLimit (scripts/k8s/lib.sh), which the backend's max_processes rests on.
POD_PIDS_LIMIT = 512
NODE_IP = "10.239.255.1"  # the dev cluster's node address on lo (scripts/k8s/lib.sh): Pods reach this machine there


def dev_cluster_kubeconfig() -> Path:
    """Where scripts/k8s/cluster.sh writes the dev cluster's admin kubeconfig."""
    return Path(os.environ.get("ORCHARD_K8S_DIR") or Path.home() / ".orchard" / "k8s") / "kubeconfig"


def dev_kubeconfig() -> str | None:
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    path = dev_cluster_kubeconfig()
    return str(path) if path.is_file() else None


def delete_namespace(kubeconfig: str, namespace: str, *, missing_ok: bool = False) -> None:
    """Delete `namespace`, its Pods first and at once (grace 0): the namespace controller would wait for
    their grace periods. `missing_ok`: a namespace never made (no test got as far as a sandbox) is fine."""
    from kubernetes import client

    from orchard.sandbox.backends.kubernetes.client import load_api_client
    api = load_api_client(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_namespace(namespace)
    except client.ApiException as e:
        if not (missing_ok and e.status == 404):
            raise
    finally:
        api.close()


def require_cluster() -> str:
    """The kubeconfig to use; skips (or, with ORCHARD_K8S=1, fails) when no cluster answers."""
    try:
        from orchard.sandbox.backends.kubernetes.client import probe_cluster
    except ImportError as e:
        reason = f"the kubernetes client is not installed ({e}); pip install -e '.[k8s]'"
    else:
        kubeconfig = dev_kubeconfig()
        reason = ("no kubeconfig: set KUBECONFIG or start the dev cluster (make k8s-up)" if kubeconfig is None
                  else probe_cluster(kubeconfig))
        if reason is None:
            return kubeconfig
    if os.environ.get("ORCHARD_K8S") == "1":
        pytest.fail(f"ORCHARD_K8S=1 but no Kubernetes cluster is reachable: {reason}", pytrace=False)
    pytest.skip(f"no Kubernetes cluster ({reason}); start one with `make k8s-up` or set ORCHARD_K8S=1 "
                "to require it")
