"""The backend conformance suite (orchard/testing/conformance/) on the Kubernetes backend, against the dev
cluster (scripts/k8s/cluster.sh; skipped without one unless ORCHARD_K8S=1). Sandboxes run the dev
cluster's busybox image; each orchestrator the suite starts gets an `instance` label of its own in one
namespace, deleted at the end."""

import secrets

import pytest

from orchard.sandbox.backends.registry import backend_config
from orchard.testing.conformance import BackendConformance
from tests.k8s_cluster import CLUSTER_SCRIPT, POD_PIDS_LIMIT, delete_namespace, require_cluster
from tests.test_k8s_backend import BASE_IMAGE

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def cluster():
    """(kubeconfig, agent image, namespace): the namespace and all in it are deleted afterwards."""
    from orchard.sandbox.backends.kubernetes.images import import_injector_image
    kubeconfig = require_cluster()
    namespace = f"orchard-conformance-{secrets.token_hex(3)}"
    yield kubeconfig, import_injector_image(CLUSTER_SCRIPT), namespace
    delete_namespace(kubeconfig, namespace)


class TestKubernetesBackend(BackendConformance):
    image = BASE_IMAGE
    max_processes = POD_PIDS_LIMIT  # the kubelet's per-Pod cap is the only one Kubernetes has

    @pytest.fixture(scope="class")
    def make_backend_config(self, cluster):
        kubeconfig, agent_image, namespace = cluster
        return lambda home: backend_config(
            "kubernetes", home, environ={}, kubeconfig=kubeconfig, agent_image=agent_image, namespace=namespace,
            instance=f"c{secrets.token_hex(4)}", image_pull_policy="Never", pod_pids_limit=POD_PIDS_LIMIT)
