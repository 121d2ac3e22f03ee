"""The Kubernetes backend: one Pod per sandbox in a sandbox namespace; the API server is only the control
plane — exec and files go straight to the agent on the Pod IP.

Per sandbox (all labelled `orchard.dev/sandbox=<id>`, `orchard.dev/instance=<instance>`):
- Pod `orchard-<id>`: init container (agent-injector image) copies the agent bundle into an emptyDir; the
  sandbox container (the user's image) runs the agent on TCP 7777 through the bundled loader; Ready once
  the agent's /health answers. Annotations carry owner, deadline and creation time.
- Secret `orchard-<id>-token`, mounted as the agent's token file;
- NetworkPolicy `orchard-<id>-egress` for network "allowlist"/"open", and for "none" with the model
  gateway (gateway.py: its address only; the namespace denies all egress);
  for "none"/"allowlist" the Pod also enforces egress itself: its first init container (the egress
  guard, egress.py) installs nftables rules in its network namespace, so no policy-capable CNI is
  needed.
Secret and policy carry an ownerReference to the Pod, so they go with it even without us.
Pod IPs and container states come from one shared watch (watch.py); the agent's own /health on the
Pod IP decides when a sandbox is handed out (health.py). See docs/kubernetes.md."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.sandbox import SandboxSpec, StartupTimings
import orchard.sandbox.backends.kubernetes.egress as egress
import orchard.sandbox.backends.kubernetes.netpol as netpol
import orchard.sandbox.backends.kubernetes.pods as pods
from orchard.core.backend import BackendSandbox
from orchard.sandbox.backends.kubernetes.config import DEFAULT_NAMESPACE, KubernetesConfig, check_pids, k8s_capabilities
from orchard.sandbox.backends.kubernetes.client import ApiCalls, load_api_client
from orchard.sandbox.backends.kubernetes.gateway import add_forwarder, parse_model_gateway
from orchard.sandbox.backends.kubernetes.harness import add_harness_bundles
from orchard.sandbox.backends.kubernetes.health import wait_agent_gone, wait_for_agent
from orchard.sandbox.backends.kubernetes.images import injector_image_name
from orchard.sandbox.backends.kubernetes.watch import PodWatcher, unschedulable_message
from orchard.sandbox.bundle import AgentBundle, BundleManifest, default_cache_dir, ensure_agent_bundle

log = logging.getLogger(__name__)
AGENT_GONE_TIMEOUT_S = 10.0  # the kubelet stops a deleted Pod's containers within a few seconds

# A Secret or policy without its Pod this old is the leftover of a create that crashed midway.
STALE_LEFTOVER_S = 120.0


class KubernetesBackend:
    """Options (`KubernetesConfig`, whose `from_env` reads them from the environment): `namespace`
    (created if missing), `instance` (label scoping this orchestrator's sandboxes within the namespace), `agent_image` (default
    `localhost/orchard-agent:<bundle key>`), `image_pull_policy`, `default_image` (used for image
    "host"), `kubeconfig` (else in-cluster config, else ~/.kube/config), `max_parallel` (API calls of
    creates/deletes in flight), `egress_guard` (enforce network "none"/"allowlist" inside the Pod too; turn
    it off only where a policy-capable CNI enforces the NetworkPolicies and NET_ADMIN init containers are
    not allowed), `pod_pids_limit` (the nodes' kubelet podPidsLimit, the only per-Pod process cap)."""

    name = "kubernetes"
    Config = KubernetesConfig

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE, instance: str = "default",
                 agent_image: str | None = None, image_pull_policy: str = "IfNotPresent",
                 default_image: str | None = None, kubeconfig: str | None = None,
                 bundle_cache_dir: Path | None = None, ready_timeout_s: float = 120.0,
                 max_parallel: int = 16, health_timeout_s: float = 5.0,
                 agent_bundle_dir: Path | None = None, egress_guard: bool = True,
                 pod_pids_limit: int | None = None, model_gateway: str | None = None) -> None:
        pods.validate_instance(instance)
        try:
            self.gateway = parse_model_gateway(model_gateway)  # network.gateway's address (http://IP:PORT)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        if image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise InvalidRequest(f"image_pull_policy {image_pull_policy!r}: use Always, IfNotPresent or Never")
        self.namespace, self.instance = namespace, instance
        self.agent_image, self.image_pull_policy = agent_image, image_pull_policy
        self.default_image, self.kubeconfig = default_image, kubeconfig
        self.bundle_cache_dir = Path(bundle_cache_dir) if bundle_cache_dir else default_cache_dir()
        # A prebuilt bundle (the one inside the injector image): the orchestrator then needs no build tools.
        self.agent_bundle_dir = Path(agent_bundle_dir) if agent_bundle_dir else None
        self.ready_timeout_s, self.health_timeout_s = ready_timeout_s, health_timeout_s
        self.egress_guard = egress_guard
        self.pod_pids_limit = pod_pids_limit
        self.capabilities = k8s_capabilities(pod_pids_limit, default_image, model_gateway=self.gateway is not None)
        self.selector = pods.instance_selector(instance)
        self._executor = ThreadPoolExecutor(max_workers=max_parallel + 4, thread_name_prefix="orchard-k8s")
        self._burst = asyncio.Semaphore(max_parallel)
        self._setup_lock = asyncio.Lock()
        self._api: ApiCalls | None = None
        self._watcher: PodWatcher | None = None
        self._bundle: AgentBundle | None = None
        self._http: httpx.AsyncClient | None = None

    @classmethod
    def from_config(cls, config: KubernetesConfig) -> "KubernetesBackend":
        return cls(**config.model_dump(exclude={"backend"}))

    # --- setup -----------------------------------------------------------------------------------------

    async def _call(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(fn, *args, **kwargs))

    async def _setup(self) -> ApiCalls:
        """Connect, make sure the namespace and its deny-all egress policy exist, start the watch."""
        if self._api is not None:
            return self._api
        async with self._setup_lock:
            if self._api is None:
                client = await self._call(load_api_client, self.kubeconfig)
                api = ApiCalls(client, self.namespace)
                await self._call(api.ensure_namespace)
                await self._call(api.ensure_policy, netpol.deny_all_egress_manifest())
                self._bundle = await self._call(self._load_bundle)
                self._watcher = PodWatcher(api.core, self.namespace, self.selector)
                self._http = httpx.AsyncClient(timeout=self.health_timeout_s, trust_env=False)
                self._api = api
        return self._api

    def _load_bundle(self) -> AgentBundle:
        if self.agent_bundle_dir is None:
            return ensure_agent_bundle(self.bundle_cache_dir)
        try:
            manifest = BundleManifest.model_validate_json((self.agent_bundle_dir / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            raise BackendError(f"ORCHARD_K8S_AGENT_BUNDLE={self.agent_bundle_dir} is not an agent bundle ({e}); "
                               "point it at the bundle the injector image was built from") from e
        return AgentBundle(path=self.agent_bundle_dir, manifest=manifest)

    # --- create ----------------------------------------------------------------------------------------

    async def create(self, sandbox_id: str, spec: SandboxSpec, token: str, *, owner: str = "") -> BackendSandbox:
        pods.validate_sandbox_id(sandbox_id)
        spec = pods.validate_image(spec, self.default_image)
        netpol.validate_network(spec.network)
        if spec.network.gateway and self.gateway is None:
            raise InvalidRequest("network.gateway (or mode 'model') asks for a model network without a gateway: "
                                 "this kubernetes backend has no model_gateway configured (orchard serve "
                                 "--model-gateway http://IP:PORT)")
        check_pids(spec, self.pod_pids_limit)
        api = await self._setup()
        await self._call(api.check_fits_a_node, spec)
        assert self._watcher is not None and self._bundle is not None
        name = pods.pod_name(sandbox_id)
        agent_image = self.agent_image or injector_image_name(self._bundle)
        guard = (egress.guard_container(spec.network, agent_image, self.image_pull_policy, self.gateway)
                 if self.egress_guard else None)
        pod_manifest = pods.pod_manifest(
            sandbox_id, spec, instance=self.instance, owner=owner, bundle=self._bundle,
            agent_image=agent_image, image_pull_policy=self.image_pull_policy, egress_guard=guard)
        if spec.network.gateway:
            pod_manifest = add_forwarder(pod_manifest, self.gateway)
        pod_manifest = add_harness_bundles(pod_manifest, spec.bundles, self.image_pull_policy)
        policy = netpol.sandbox_policy_manifest(sandbox_id, self.instance, spec.network, self.gateway)
        started = self._watcher.wait_started(name)
        deadline = time.monotonic() + self.ready_timeout_s
        begun = time.monotonic()
        try:
            async with self._burst:
                await self._call(api.create_secret, pods.secret_manifest(sandbox_id, self.instance, token))
                if policy is not None:
                    await self._call(api.create_policy, policy)
                pod = await self._call(api.create_pod, pod_manifest)
                await self._call(api.adopt_by_pod, sandbox_id, pod, policy is not None)
            try:
                pod = await asyncio.wait_for(asyncio.shield(started), deadline - time.monotonic())
            except TimeoutError:
                raise BackendError(f"pod {name} did not start its agent within {self.ready_timeout_s:g} s"
                                   f"{self._pending_reason(name)}") from None
            agent_url = f"http://{pod.status.pod_ip}:{pods.AGENT_PORT}"
            running = time.monotonic()
            # The sandbox is handed out when the agent answers us, not when the kubelet says Ready.
            await wait_for_agent(self._http, agent_url, name, lambda: self._watcher.get(name), deadline)
            healthy = time.monotonic()
            # Pod created → running with an IP (pull, schedule, init container), then → the agent's first
            # health answer (the agent's start is not seen apart from it here).
            timings = StartupTimings(backend_create_ms=(running - begun) * 1000,
                                     first_health_ms=(healthy - running) * 1000, total_ms=(healthy - begun) * 1000)
            return BackendSandbox(id=sandbox_id, agent_url=agent_url, handle=_handle(pod), timings=timings)
        except BaseException:
            self._watcher.forget(name, started)
            started.cancel()
            await asyncio.shield(self._delete_objects(sandbox_id))
            raise

    def _pending_reason(self, name: str) -> str:
        pod = self._watcher.get(name) if self._watcher else None
        if pod is None:
            return ""
        reason = unschedulable_message(pod)
        if reason:
            return f": the scheduler says {reason!r}"
        return f" (phase {pod.status.phase if pod.status else 'unknown'}); `kubectl -n {self.namespace} " \
               f"describe pod {name}` says why"

    # --- delete / liveness / discovery -----------------------------------------------------------------

    async def delete(self, sandbox: BackendSandbox) -> None:
        await self._setup()
        await self._delete_objects(sandbox.id)
        # Deleted means its agent answers no more (what clients holding its token see as SandboxLost).
        if sandbox.agent_url and not await wait_agent_gone(sandbox.agent_url, time.monotonic() + AGENT_GONE_TIMEOUT_S):
            log.warning("sandbox %s: its agent at %s still accepted connections %g s after its Pod was deleted",
                        sandbox.id, sandbox.agent_url, AGENT_GONE_TIMEOUT_S)

    async def _delete_objects(self, sandbox_id: str) -> None:
        """Pod, Secret and policy, at once (grace 0: the API object goes now, the kubelet stops the
        containers). Missing objects are fine: idempotent."""
        api = await self._setup()
        async with self._burst:
            await self._call(api.delete_sandbox_objects, sandbox_id)

    async def is_alive(self, sandbox: BackendSandbox) -> bool:
        api = await self._setup()
        name = pods.pod_name(sandbox.id)
        assert self._watcher is not None
        if self._watcher.synced.is_set():
            pod = self._watcher.get(name)
        else:
            pod = await self._call(api.read_pod, name)
        return pod is not None and _pod_alive(pod, sandbox.handle.get("uid"))

    async def list_live(self) -> list[BackendSandbox]:
        """This instance's Pods, from their labels and annotations. Dead Pods (failed, evicted, past their
        deadline) and leftovers of crashed creates (a Secret or policy without its Pod) are removed."""
        api = await self._setup()
        listed_pods, secrets, policies = await asyncio.gather(
            self._call(api.list_pods, self.selector), self._call(api.list_secrets, self.selector),
            self._call(api.list_policies, self.selector))
        live, dead, with_pod = [], [], set()
        for pod in listed_pods:
            sandbox_id = (pod.metadata.labels or {}).get(pods.SANDBOX_LABEL)
            if not sandbox_id or pod.metadata.deletion_timestamp is not None:
                continue
            with_pod.add(sandbox_id)
            if pod.status and pod.status.phase in ("Failed", "Succeeded"):
                dead.append(sandbox_id)
                continue
            url = f"http://{pod.status.pod_ip}:{pods.AGENT_PORT}" if pod.status and pod.status.pod_ip else ""
            live.append(BackendSandbox(id=sandbox_id, agent_url=url, handle=_handle(pod)))
        now = time.time()
        for obj in [*secrets, *policies]:
            sandbox_id = (obj.metadata.labels or {}).get(pods.SANDBOX_LABEL)
            created = obj.metadata.creation_timestamp
            if (sandbox_id and sandbox_id not in with_pod and created is not None
                    and now - created.timestamp() > STALE_LEFTOVER_S):
                dead.append(sandbox_id)
        for sandbox_id in sorted(set(dead)):
            log.info("removing leftovers of dead kubernetes sandbox %s", sandbox_id)
            await self._delete_objects(sandbox_id)
        return live

    async def close(self) -> None:
        """Stop the watch and the HTTP client; sandboxes keep running (a restart re-adopts them)."""
        if self._watcher is not None:
            self._watcher.stop()
        if self._http is not None:
            await self._http.aclose()
        if self._api is not None:
            await self._call(self._api.close)
        self._executor.shutdown(wait=False, cancel_futures=True)


def _handle(pod) -> dict:
    annotations = pod.metadata.annotations or {}
    return {"pod": pod.metadata.name, "namespace": pod.metadata.namespace, "uid": pod.metadata.uid,
            "ip": pod.status.pod_ip if pod.status else None,
            "owner": annotations.get(pods.OWNER_ANNOTATION, ""),
            "deadline": float(annotations.get(pods.DEADLINE_ANNOTATION) or 0)}


def _pod_alive(pod, uid: str | None) -> bool:
    if uid and pod.metadata.uid != uid:
        return False  # a new Pod of the same name is not our sandbox
    if (pod.metadata.deletion_timestamp is not None or pod.status is None
            or pod.status.phase in ("Failed", "Succeeded")):
        return False
    # Its agent answered before the sandbox was handed out; the kubelet may still report the container
    # as waiting (Pending) for up to a second after that (its 1 s relist): only a terminated one is dead.
    for cs in pod.status.container_statuses or []:
        if cs.name == pods.SANDBOX_CONTAINER:
            return cs.state is None or cs.state.terminated is None
    return True
