"""One pod watch per backend: a thread lists the backend's Pods, then watches them from that
resourceVersion, keeps the latest state of each and settles the futures of creates waiting for their Pod
to start its agent (or to fail). No polling: the API server pushes every change.

A create registers its waiter before it creates the Pod, so no event is missed. Outcomes (`pod_outcome`):
an IP and the agent starting (injector done, sandbox container running, or Ready) → the Pod; a bad image
or a dead container → an error at once; deleted → an error.

Why not wait for Ready: the kubelet notices container state changes on its 1 s relist, so "injector
done → sandbox running → Ready" costs up to three 1 s steps. The sandbox container starts as soon as the
kubelet has seen the injector finish; from there the orchestrator's own /health check on the Pod IP
(health.py) finds the agent up about a second before the kubelet would report it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from orchard.core.errors import BackendError, InvalidRequest, OrchardError
from orchard.sandbox.backends.kubernetes.egress import GUARD_CONTAINER
from orchard.sandbox.backends.kubernetes.pods import INJECTOR_CONTAINER, SANDBOX_CONTAINER

log = logging.getLogger(__name__)

# Waiting reasons that will not fix themselves: the image is not there or cannot be used.
IMAGE_ERRORS = {"ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                "RegistryUnavailable"}
CONTAINER_ERRORS = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                    "CrashLoopBackOff"}
WATCH_TIMEOUT_S = 240  # the server ends each watch after this; the thread resumes from the last version


@dataclass
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    unschedulable_since: float | None = None


@dataclass
class PodWatcher:
    core: object  # kubernetes.client.CoreV1Api
    namespace: str
    selector: str
    pods: dict = field(default_factory=dict)  # name → latest V1Pod
    synced: threading.Event = field(default_factory=threading.Event)
    unschedulable_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, list[_Waiter]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"orchard-k8s-watch-{self.namespace}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The thread ends at its watch's next event or timeout; it holds nothing that needs closing."""
        self._stop.set()

    def wait_started(self, name: str) -> asyncio.Future:
        """A future resolved with the Pod once it has an IP and its agent is starting (see
        `agent_starting`), or failed with a typed error. Register it before creating the Pod."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, loop.create_future())
        with self._lock:
            self._waiters.setdefault(name, []).append(waiter)
        return waiter.future

    def forget(self, name: str, future: asyncio.Future) -> None:
        with self._lock:
            waiters = [w for w in self._waiters.get(name, []) if w.future is not future]
            if waiters:
                self._waiters[name] = waiters
            else:
                self._waiters.pop(name, None)

    def get(self, name: str):
        with self._lock:
            return self.pods.get(name)

    # --- the thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._relist()
                backoff = 0.5
                self._watch(version)
            except ApiException as e:
                if e.status != 410:  # 410 Gone: our version is too old, relist at once
                    log.warning("pod watch in %s failed (HTTP %s: %s); retrying", self.namespace, e.status,
                                e.reason)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
            except Exception as e:  # connection dropped, API server restarting, ...
                if self._stop.is_set():
                    return
                log.warning("pod watch in %s failed (%s); retrying", self.namespace, e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _relist(self) -> str:
        listing = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        current = {p.metadata.name: p for p in listing.items}
        with self._lock:
            gone = set(self.pods) - set(current)
            self.pods = current
        self.synced.set()
        for pod in current.values():
            self._settle(pod.metadata.name, pod, deleted=False)
        for name in gone:
            self._settle(name, None, deleted=True)
        return listing.metadata.resource_version

    def _watch(self, version: str) -> None:
        w = watch.Watch()
        try:
            for event in w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                  resource_version=version, timeout_seconds=WATCH_TIMEOUT_S):
                if self._stop.is_set():
                    return
                kind, pod = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=getattr(pod, "code", None) or 500, reason=str(pod))
                name = pod.metadata.name
                with self._lock:
                    if kind == "DELETED":
                        self.pods.pop(name, None)
                    else:
                        self.pods[name] = pod
                self._settle(name, pod, deleted=kind == "DELETED")
        finally:
            w.stop()

    def _settle(self, name: str, pod, *, deleted: bool) -> None:
        with self._lock:
            waiters = list(self._waiters.get(name, []))
        if not waiters:
            return
        now = time.monotonic()
        for waiter in waiters:
            outcome = pod_outcome(pod, deleted=deleted)
            if outcome is None and pod is not None and unschedulable_message(pod):
                # The scheduler also says this while the node is merely full for a moment: give it time.
                waiter.unschedulable_since = waiter.unschedulable_since or now
                if now - waiter.unschedulable_since > self.unschedulable_timeout_s:
                    outcome = BackendError(f"pod {name} could not be scheduled for "
                                           f"{self.unschedulable_timeout_s:g} s: {unschedulable_message(pod)}")
            if outcome is None:
                continue
            self.forget(name, waiter.future)
            waiter.loop.call_soon_threadsafe(_resolve, waiter.future, outcome)


def _resolve(future: asyncio.Future, outcome) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


CONTAINER_ROLES = {GUARD_CONTAINER: "egress guard", INJECTOR_CONTAINER: "agent injector",
                   SANDBOX_CONTAINER: "sandbox container"}
GUARD_HINT = (". The egress guard runs the agent-injector image's /egress/apply with NET_ADMIN: rebuild that "
              "image with this orchard (it adds the tool), and let the sandbox namespace's Pods add NET_ADMIN; "
              "see 'Network' in docs/kubernetes.md")


def unschedulable_message(pod) -> str | None:
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return cond.message or "unschedulable"
    return None


def pod_outcome(pod, *, deleted: bool) -> object | OrchardError | None:
    """The Pod when it has an IP and its agent is starting, an error when it can no longer become Ready,
    else None."""
    if deleted or pod is None:
        return BackendError("its pod was deleted while the sandbox was starting")
    name = pod.metadata.name
    if pod.metadata.deletion_timestamp is not None:
        return BackendError(f"pod {name} is being deleted while the sandbox was starting")
    status = pod.status
    if status is None:
        return None
    for cs in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        which = CONTAINER_ROLES.get(cs.name, f"container {cs.name}")
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in IMAGE_ERRORS:
            return InvalidRequest(f"the {which} of pod {name} cannot start: image {cs.image!r} is not "
                                  f"available ({waiting.reason}: {waiting.message or 'no details'}); check "
                                  "the image name, or import/push the image where the cluster can pull it")
        hint = GUARD_HINT if cs.name == GUARD_CONTAINER else ""
        if waiting is not None and waiting.reason in CONTAINER_ERRORS:
            return BackendError(f"the {which} of pod {name} cannot start ({waiting.reason}: "
                                f"{waiting.message or 'no details'}){hint}")
        term = cs.state.terminated if cs.state else None
        failed_init = cs.name != SANDBOX_CONTAINER and term is not None and term.exit_code != 0
        if failed_init or (cs.name == SANDBOX_CONTAINER and term is not None):
            return BackendError(f"the {which} of pod {name} exited with code {term.exit_code} "
                                f"({term.reason}): {(term.message or '').strip()[-1500:] or 'no output'}{hint}")
    if status.phase in ("Failed", "Succeeded"):
        return BackendError(f"pod {name} ended ({status.phase}, {status.reason}: {status.message})")
    if status.pod_ip and agent_starting(pod):
        return pod
    return None


def is_ready(pod) -> bool:
    """The kubelet's readinessProbe reached the agent."""
    status = pod.status
    return status is not None and any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def agent_starting(pod) -> bool:
    """The sandbox container runs or is about to: the kubelet starts it right after it has seen the
    injector exit 0, in the same sync, so by then its /health is worth trying."""
    if is_ready(pod):
        return True
    for cs in pod.status.init_container_statuses or []:
        term = cs.state.terminated if cs.state else None
        if cs.name == INJECTOR_CONTAINER and term is not None and term.exit_code == 0:
            return True
    return any(cs.name == SANDBOX_CONTAINER and cs.state is not None and cs.state.running is not None
               for cs in pod.status.container_statuses or [])
