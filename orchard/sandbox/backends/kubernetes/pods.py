"""What the Kubernetes backend creates for one sandbox, as plain manifests (dicts the API accepts as-is):
the Pod (agent injector init container + the user's image running the agent on TCP) and the Secret
holding the sandbox token. Names, labels and annotations live here too: they are how `list_live` finds
sandboxes again after a restart."""

from __future__ import annotations

import math
import re
import time

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import SandboxSpec
from orchard.sandbox.bundle import DEFAULT_MOUNT_POINT, AgentBundle
from orchard.sandbox.images.refs import OCI_PREFIX, strip_oci_prefix

AGENT_PORT = 7777
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "orchard"
SANDBOX_LABEL = "orchard.dev/sandbox"
INSTANCE_LABEL = "orchard.dev/instance"
OWNER_ANNOTATION = "orchard.dev/owner"
DEADLINE_ANNOTATION = "orchard.dev/deadline"
CREATED_ANNOTATION = "orchard.dev/created"
SANDBOX_CONTAINER = "sandbox"
INJECTOR_CONTAINER = "agent-injector"
BUNDLE_VOLUME = "orchard-agent"
TOKEN_VOLUME = "orchard-token"
TOKEN_MOUNT = "/.orchard-token"
TOKEN_KEY = "token"
# The injector image holds the bundle at /agent and a static busybox; it copies the bundle into the
# emptyDir that the sandbox container sees at DEFAULT_MOUNT_POINT.
INJECTOR_BUNDLE_DIR = "/agent"
INJECTOR_COMMAND = ["/bin/cp", "-a", f"{INJECTOR_BUNDLE_DIR}/.", f"{DEFAULT_MOUNT_POINT}/"]
# The pod stops itself if the orchestrator is gone long past the sandbox's TTL.
ACTIVE_DEADLINE_MARGIN_S = 300
# With an egress guard in the Pod the workload must not change (NET_ADMIN) or bypass (NET_RAW: AF_PACKET
# frames skip netfilter) the Pod's nftables rules; neither is granted by default, both are dropped by name.
GUARDED_WORKLOAD_DROPS = ("NET_ADMIN", "NET_RAW")
# Pod names are DNS labels: "orchard-" + id must stay within 63 characters.
K8S_SANDBOX_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,53}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")


def pod_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}"


def secret_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}-token"


def policy_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}-egress"


def validate_sandbox_id(sandbox_id: str) -> None:
    if not K8S_SANDBOX_ID.fullmatch(sandbox_id):
        raise InvalidRequest(f"sandbox id {sandbox_id!r} cannot name a Kubernetes Pod: use 1-55 lower-case "
                             "letters, digits or '-', starting and ending with a letter or digit")


def validate_instance(instance: str) -> None:
    if not instance or not LABEL_VALUE.fullmatch(instance):
        raise InvalidRequest(f"instance {instance!r} is not a valid Kubernetes label value: use 1-63 "
                             "letters, digits, '-', '_' or '.', starting and ending with a letter or digit")


def sandbox_labels(sandbox_id: str, instance: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGED_BY_VALUE, INSTANCE_LABEL: instance, SANDBOX_LABEL: sandbox_id}


def instance_selector(instance: str) -> str:
    """Label selector for every object of one backend instance (one orchestrator store)."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{INSTANCE_LABEL}={instance}"


def resources(spec: SandboxSpec) -> dict:
    """Requests equal limits (Guaranteed QoS when cpu and memory are both set): a sandbox gets what it
    asked for and no more. Unset values stay unset (no limit, best effort)."""
    limits: dict[str, str] = {}
    if spec.cpu is not None:
        limits["cpu"] = f"{max(1, round(spec.cpu * 1000))}m"
    if spec.memory_mb is not None:
        limits["memory"] = f"{spec.memory_mb}Mi"
    if spec.disk_mb is not None:
        limits["ephemeral-storage"] = f"{spec.disk_mb}Mi"
    return {"limits": dict(limits), "requests": dict(limits)} if limits else {}


def secret_manifest(sandbox_id: str, instance: str, token: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret_name(sandbox_id), "labels": sandbox_labels(sandbox_id, instance)},
            "type": "Opaque", "stringData": {TOKEN_KEY: token}}


def pod_manifest(sandbox_id: str, spec: SandboxSpec, *, instance: str, owner: str, bundle: AgentBundle,
                 agent_image: str, image_pull_policy: str, egress_guard: dict | None = None,
                 now: float | None = None) -> dict:
    """The sandbox's Pod. The token reaches the agent only as a file from the Secret; the Pod spec names
    the Secret, never its content. `egress_guard` (egress.guard_container) runs first of all and
    then the sandbox container lacks NET_ADMIN and NET_RAW, which could undo or bypass its rules."""
    now = time.time() if now is None else now
    mount = DEFAULT_MOUNT_POINT
    argv = bundle.launch_argv(listen=f"tcp:0.0.0.0:{AGENT_PORT}", workdir=spec.workdir, mount_point=mount)
    env = {**spec.env, **bundle.launch_env(mount_point=mount),
           "ORCHARD_AGENT_TOKEN_FILE": f"{TOKEN_MOUNT}/{TOKEN_KEY}"}
    sandbox = {
        "name": SANDBOX_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": image_pull_policy,
        "command": argv,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        # Ready (for Services, `kubectl get`) once the agent answers. `create` does not wait for it (it
        # checks /health itself, about a second earlier), so a relaxed period spares the kubelet and
        # the agent a probe per sandbox per second.
        "readinessProbe": {"httpGet": {"path": "/health", "port": AGENT_PORT}, "periodSeconds": 5,
                           "timeoutSeconds": 2, "successThreshold": 1, "failureThreshold": 2},
        "resources": resources(spec),
        # The agent's stderr becomes the termination message when it dies: a failed create says why.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": BUNDLE_VOLUME, "mountPath": mount, "readOnly": True},
                         {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT, "readOnly": True}],
    }
    if egress_guard is not None:
        sandbox["securityContext"] = {"capabilities": {"drop": list(GUARDED_WORKLOAD_DROPS)}}
    injector = {
        "name": INJECTOR_CONTAINER,
        "image": agent_image,
        "imagePullPolicy": image_pull_policy,
        "command": INJECTOR_COMMAND,
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                      "limits": {"cpu": "1", "memory": "64Mi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": BUNDLE_VOLUME, "mountPath": mount}],
    }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": pod_name(sandbox_id),
            "labels": {**sandbox_labels(sandbox_id, instance)},
            "annotations": {OWNER_ANNOTATION: owner, DEADLINE_ANNOTATION: f"{now + spec.timeout_s:.3f}",
                            CREATED_ANNOTATION: f"{now:.3f}"},
        },
        "spec": {
            "restartPolicy": "Never",
            # The agent stops on SIGTERM at once; a long grace only delays deletion.
            "terminationGracePeriodSeconds": 1,
            "activeDeadlineSeconds": math.ceil(spec.timeout_s) + ACTIVE_DEADLINE_MARGIN_S,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostname": sandbox_id[:63],
            # The pause container is then PID 1 of the Pod and reaps the processes a command leaves behind;
            # otherwise the agent would be PID 1 and they would stay zombies, counting against the pids cap.
            "shareProcessNamespace": True,
            "initContainers": [*([egress_guard] if egress_guard is not None else []), injector],
            "containers": [sandbox],
            "volumes": [{"name": BUNDLE_VOLUME, "emptyDir": {}},
                        {"name": TOKEN_VOLUME, "secret": {"secretName": secret_name(sandbox_id),
                                                          "defaultMode": 0o400}}],
        },
    }


def owner_reference(pod) -> dict:
    """Makes the garbage collector delete a Secret/NetworkPolicy with its Pod (also when the orchestrator
    is gone)."""
    return {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid,
            "blockOwnerDeletion": False}


def validate_image(spec: SandboxSpec, default_image: str | None) -> SandboxSpec:
    """The Kubernetes backend runs OCI images (`oci:NAME` is NAME, as `orchard image import` names it for
    the local backend); the local backend's `host` means the default image."""
    if spec.image.startswith(OCI_PREFIX):
        spec = spec.model_copy(update={"image": strip_oci_prefix(spec.image)})
    if spec.image == "host" or spec.image.startswith("/"):
        if default_image:
            return spec.model_copy(update={"image": default_image})
        raise InvalidRequest(f"image {spec.image!r} is a local-backend image; the kubernetes backend runs OCI "
                             "images: pass e.g. image='debian:bookworm' (or set ORCHARD_K8S_DEFAULT_IMAGE)")
    return spec
