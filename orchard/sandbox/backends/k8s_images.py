"""The agent-injector image: a static busybox (for `cp`) plus the agent bundle at /agent. Its init
container copies the bundle into the Pod's emptyDir, from where the sandbox container (any image, with
or without Python) runs the agent through the bundled loader.

The image is named after the bundle key (`localhost/orchard-agent:<key>`), so a changed agent or
interpreter gets a new image. No registry is needed: `build_injector_rootfs` makes the root file system
and an import command (the dev cluster's `cluster.sh import-image`) turns it into an image in the node's
containerd. For a real cluster, push the same root file system as a one-layer image to your registry and
point the backend at it (`ORCHARD_K8S_AGENT_IMAGE`).

    python -m orchard.sandbox.backends.k8s_images --rootfs DIR            # just the root file system
    python -m orchard.sandbox.backends.k8s_images --import-with cluster.sh  # build + import, prints name
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchard.core.errors import BackendError
from orchard.sandbox.backends.k8s_pods import INJECTOR_BUNDLE_DIR, INJECTOR_COMMAND
from orchard.sandbox.bundle import AgentBundle, ensure_agent_bundle

IMAGE_REPOSITORY = "localhost/orchard-agent"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


def injector_image_name(bundle: AgentBundle) -> str:
    return f"{IMAGE_REPOSITORY}:{bundle.manifest.key}"


def find_static_busybox() -> Path:
    for candidate in (shutil.which("busybox"), *BUSYBOX_CANDIDATES):
        if candidate and Path(candidate).is_file() and _is_static(Path(candidate)):
            return Path(candidate)
    raise BackendError("building the agent-injector image needs a statically linked busybox; install "
                       "Debian's busybox-static (apt-get install busybox-static)")


def _is_static(binary: Path) -> bool:
    """No PT_INTERP program header (64-bit ELF): runs in an image without a libc."""
    import struct
    with open(binary, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            if struct.unpack("<I", f.read(4))[0] == 3:
                return False
    return True


def build_injector_rootfs(bundle: AgentBundle, dest: Path) -> None:
    """Fill the empty directory `dest` with the injector's root file system."""
    bindir = dest / "bin"
    bindir.mkdir(parents=True)
    shutil.copy2(find_static_busybox(), bindir / "busybox")
    for applet in ("cp", "sh", "ls"):
        os.symlink("busybox", bindir / applet)
    shutil.copytree(bundle.path, dest / INJECTOR_BUNDLE_DIR.lstrip("/"), symlinks=True)


def import_injector_image(import_script: Path, bundle: AgentBundle | None = None) -> str:
    """Build the image and import it with `bash IMPORT_SCRIPT import-image NAME ROOTFS ENTRYPOINT`;
    returns the image name."""
    bundle = bundle or ensure_agent_bundle()
    name = injector_image_name(bundle)
    with tempfile.TemporaryDirectory(prefix="orchard-agent-image.") as tmp:
        rootfs = Path(tmp) / "rootfs"
        build_injector_rootfs(bundle, rootfs)
        result = subprocess.run(["bash", str(import_script), "import-image", name, str(rootfs),
                                 json.dumps(INJECTOR_COMMAND)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError(f"importing {name} with {import_script} failed (exit {result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the Orchard agent-injector image.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--rootfs", type=Path, help="write the root file system into this new directory")
    group.add_argument("--import-with", type=Path, metavar="SCRIPT",
                       help="build and import with `SCRIPT import-image` (scripts/k8s/cluster.sh)")
    args = parser.parse_args(argv)
    bundle = ensure_agent_bundle()
    if args.rootfs:
        build_injector_rootfs(bundle, args.rootfs)
        print(f"{injector_image_name(bundle)} {json.dumps(INJECTOR_COMMAND)}")
    else:
        print(import_injector_image(args.import_with, bundle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
