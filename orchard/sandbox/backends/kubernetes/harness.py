"""Harness bundles on Kubernetes: each bundle ships as an injector image (`localhost/orchard-harness-<name>:
<key>`, the key of its spec, so an orchestrator needs only the spec to name it; built and imported by
harness_images.py), whose init container copies it into an emptyDir that the sandbox container mounts
read-only at /.orchard/harness/<name>. (Image volumes would avoid the copy; the clusters we target predate
them.)

The init container also mounts the agent's emptyDir at /.orchard, so the runtime makes the bundle's mount
point `harness/<name>` there while it is writable: in the sandbox container /.orchard is read-only, and a
mount point could not be made in it."""

from __future__ import annotations

from orchard.core.harness_bundle import HarnessBundleSpec, get_bundle_spec
from orchard.core.sandbox import HARNESS_MOUNT_ROOT
from orchard.sandbox.backends.kubernetes.pods import BUNDLE_VOLUME, SANDBOX_CONTAINER
from orchard.sandbox.bundle import DEFAULT_MOUNT_POINT
from orchard.sandbox.harness_bundles.store import bundle_key

IMAGE_REPOSITORY = "localhost/orchard-harness"
INJECTOR_BUNDLE_DIR = "/bundle"
NAME_ANNOTATION = "orchard.dev/harness-bundles"


def harness_image_name(spec: HarnessBundleSpec) -> str:
    return f"{IMAGE_REPOSITORY}-{spec.name}:{bundle_key(spec)}"


def injector_command(spec: HarnessBundleSpec) -> list[str]:
    return ["/bin/cp", "-a", f"{INJECTOR_BUNDLE_DIR}/.", f"{spec.mount_point()}/"]


def add_harness_bundles(pod: dict, names: list[str], image_pull_policy: str) -> dict:
    """One init container and emptyDir per bundle named (unknown names: InvalidRequest listing the known
    ones); the sandbox container mounts each read-only at HARNESS_MOUNT_ROOT/<name>."""
    specs = [get_bundle_spec(name) for name in names]
    if not specs:
        return pod
    spec_of_pod = pod["spec"]
    sandbox = next(c for c in spec_of_pod["containers"] if c["name"] == SANDBOX_CONTAINER)
    for index, spec in enumerate(specs):
        volume = f"orchard-harness-{index}"  # DNS labels: bundle names may hold '.' and '_'
        spec_of_pod["volumes"].append({"name": volume, "emptyDir": {}})
        spec_of_pod["initContainers"].append({
            "name": f"harness-{index}",
            "image": harness_image_name(spec),
            "imagePullPolicy": image_pull_policy,
            "command": injector_command(spec),
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}},
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [{"name": BUNDLE_VOLUME, "mountPath": DEFAULT_MOUNT_POINT},
                             {"name": volume, "mountPath": spec.mount_point()}],
        })
        sandbox["volumeMounts"].append({"name": volume, "mountPath": f"{HARNESS_MOUNT_ROOT}/{spec.name}",
                                        "readOnly": True})
    pod["metadata"].setdefault("annotations", {})[NAME_ANNOTATION] = ",".join(names)
    return pod
