"""The Kubernetes API calls the backend makes (blocking; the backend runs them in its thread pool), with
API errors turned into Orchard's typed errors that say what to do."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.utils import parse_quantity

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import SandboxSpec
import orchard.sandbox.backends.kubernetes.pods as pods

NODE_CACHE_S = 60.0
POOL_SIZE = 32  # urllib3 connections to the API server: bursts of creates share them


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """In a Pod: its service account. Else the kubeconfig (`kubeconfig`, $KUBECONFIG, ~/.kube/config)."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (ConfigException, OSError) as e:
        raise BackendError(f"no usable Kubernetes configuration ({e}): set KUBECONFIG to a kubeconfig file, or "
                           "run the orchestrator in a Pod with a service account (deploy/k8s)") from e
    configuration.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(configuration)


@contextlib.contextmanager
def api_errors(what: str, namespace: str):
    try:
        yield
    except ApiException as e:
        detail = (e.body or e.reason or "").strip()[:1000] if isinstance(e.body, str) else e.reason
        if e.status == 422:
            raise InvalidRequest(f"Kubernetes rejected the {what}: {detail}") from e
        if e.status in (401, 403):
            raise BackendError(f"Kubernetes refused to let the orchestrator {what} in namespace {namespace} "
                               f"(HTTP {e.status}): give its service account the Role in "
                               "deploy/k8s/rbac.yaml") from e
        raise BackendError(f"Kubernetes API error on {what} (HTTP {e.status}): {detail}") from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise BackendError(f"the Kubernetes API server cannot be reached to {what} ({e}); check that the "
                           "cluster runs and KUBECONFIG points at it") from e


class ApiCalls:
    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self._nodes_lock = threading.Lock()
        self._nodes: tuple[float, list[dict] | None] = (0.0, None)

    def close(self) -> None:
        self.api_client.close()

    # --- namespace setup -------------------------------------------------------------------------------

    def ensure_namespace(self) -> None:
        with api_errors("read the sandbox namespace", self.namespace):
            try:
                self.core.read_namespace(self.namespace)
                return
            except ApiException as e:
                if e.status == 403:  # a namespaced Role cannot read Namespaces: assume it was deployed
                    return
                if e.status != 404:
                    raise
        with api_errors("create the sandbox namespace", self.namespace):
            try:
                self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": self.namespace}})
            except ApiException as e:
                if e.status != 409:
                    raise

    def ensure_policy(self, manifest: dict) -> None:
        with api_errors("create the namespace's NetworkPolicy", self.namespace):
            try:
                self.net.create_namespaced_network_policy(self.namespace, manifest)
            except ApiException as e:
                if e.status != 409:
                    raise

    # --- per sandbox -----------------------------------------------------------------------------------

    def check_fits_a_node(self, spec: SandboxSpec) -> None:
        """Refuse at once a sandbox no node could ever hold (the scheduler would keep it Pending). Skipped
        when the orchestrator may not list nodes."""
        nodes = self._allocatable()
        if not nodes:
            return
        wanted = {"cpu": spec.cpu, "memory": spec.memory_mb and spec.memory_mb * 2**20,
                  "ephemeral-storage": spec.disk_mb and spec.disk_mb * 2**20}
        for resource, amount in wanted.items():
            if amount and all(amount > n.get(resource, 0) for n in nodes):
                best = max(n.get(resource, 0) for n in nodes)
                raise InvalidRequest(f"no node can hold this sandbox: it asks for {resource} {amount:g} "
                                     f"({_unit(resource)}), the largest node has {float(best):g} allocatable; "
                                     "ask for less")

    def _allocatable(self) -> list[dict] | None:
        with self._nodes_lock:
            at, nodes = self._nodes
            if time.monotonic() - at < NODE_CACHE_S:
                return nodes
            try:
                items = self.core.list_node().items
                nodes = [{k: float(parse_quantity(v)) for k, v in (n.status.allocatable or {}).items()}
                         for n in items]
            except ApiException:
                nodes = None  # no permission to list nodes: the scheduler's verdict has to do
            self._nodes = (time.monotonic(), nodes)
            return nodes

    def create_secret(self, manifest: dict) -> None:
        with api_errors("create the sandbox's token Secret", self.namespace):
            try:
                self.core.create_namespaced_secret(self.namespace, manifest)
            except ApiException as e:
                if e.status == 409:
                    raise InvalidRequest(f"secret {manifest['metadata']['name']} already exists: a sandbox "
                                         "with this id exists; delete it or use another id") from e
                raise

    def create_policy(self, manifest: dict) -> None:
        with api_errors("create the sandbox's NetworkPolicy", self.namespace):
            self.net.create_namespaced_network_policy(self.namespace, manifest)

    def create_pod(self, manifest: dict):
        with api_errors("create the sandbox Pod", self.namespace):
            return self.core.create_namespaced_pod(self.namespace, manifest)

    def adopt_by_pod(self, sandbox_id: str, pod, has_policy: bool) -> None:
        """Owner references to the Pod: the garbage collector removes the Secret and policy with it."""
        patch = {"metadata": {"ownerReferences": [pods.owner_reference(pod)]}}
        with api_errors("link the sandbox's Secret to its Pod", self.namespace):
            self.core.patch_namespaced_secret(pods.secret_name(sandbox_id), self.namespace, patch)
            if has_policy:
                self.net.patch_namespaced_network_policy(pods.policy_name(sandbox_id), self.namespace,
                                                         patch)

    def delete_sandbox_objects(self, sandbox_id: str) -> None:
        now = client.V1DeleteOptions(grace_period_seconds=0, propagation_policy="Background")
        calls = [(self.core.delete_namespaced_pod, pods.pod_name(sandbox_id)),
                 (self.core.delete_namespaced_secret, pods.secret_name(sandbox_id)),
                 (self.net.delete_namespaced_network_policy, pods.policy_name(sandbox_id))]
        for delete, name in calls:
            with api_errors(f"delete {name}", self.namespace):
                try:
                    delete(name, self.namespace, body=now)
                except ApiException as e:
                    if e.status != 404:
                        raise

    def read_pod(self, name: str):
        with api_errors(f"read pod {name}", self.namespace):
            try:
                return self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise

    def list_pods(self, selector: str) -> list:
        with api_errors("list sandbox Pods", self.namespace):
            return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def list_secrets(self, selector: str) -> list:
        with api_errors("list sandbox Secrets", self.namespace):
            return self.core.list_namespaced_secret(self.namespace, label_selector=selector).items

    def list_policies(self, selector: str) -> list:
        with api_errors("list sandbox NetworkPolicies", self.namespace):
            return self.net.list_namespaced_network_policy(self.namespace, label_selector=selector).items


def _unit(resource: str) -> str:
    return "cores" if resource == "cpu" else "bytes"


def probe_cluster(kubeconfig: str | None, timeout_s: float = 3.0) -> str | None:
    """None when the API server answers /readyz with this configuration, else why not (for skip
    messages and errors)."""
    try:
        api_client = load_api_client(kubeconfig)
    except BackendError as e:
        return str(e)
    try:
        client.VersionApi(api_client).get_code(_request_timeout=timeout_s)
        return None
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        return f"the API server at {api_client.configuration.host} does not answer ({e})"
    finally:
        api_client.close()
