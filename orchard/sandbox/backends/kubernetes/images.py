"""The agent-injector image: a static busybox (for `cp`) plus the agent bundle at /agent. Its init
container copies the bundle into the Pod's emptyDir, from where the sandbox container (any image, with
or without Python) runs the agent through the bundled loader. The same image carries the egress guard's
tool at /egress (egress.py): Debian's `nft` with the libraries `ldd` names and the dynamic loader,
and `/egress/apply`, a busybox script that runs it through that loader (no libc in the image).

The image is named after the bundle key and its layout (`localhost/orchard-agent:<key>-egress1`), so a
changed agent or interpreter, or an image from before the egress tool, is never taken for the current one. No registry is needed: `build_injector_rootfs` makes the root file system
and an import command (the dev cluster's `cluster.sh import-image`) turns it into an image in the node's
containerd. For a real cluster, push the same root file system as a one-layer image to your registry and
point the backend at it (`ORCHARD_K8S_AGENT_IMAGE`).

    python -m orchard.sandbox.backends.kubernetes.images --rootfs DIR            # just the root file system
    python -m orchard.sandbox.backends.kubernetes.images --import-with cluster.sh  # build + import, prints name
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
from orchard.sandbox.backends.kubernetes.egress import APPLY_SCRIPT, CHAIN, EGRESS_DIR, TABLE
from orchard.sandbox.backends.kubernetes.pods import INJECTOR_BUNDLE_DIR, INJECTOR_COMMAND
from orchard.sandbox.bundle import AgentBundle, copy_native_libraries, ensure_agent_bundle

IMAGE_REPOSITORY = "localhost/orchard-agent"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
NFT_CANDIDATES = ("/usr/sbin/nft", "/sbin/nft")
# The image's layout beyond the bundle (the /egress tool): part of the tag, so an image built before a
# layout change is never taken for a current one with the same bundle.
IMAGE_LAYOUT = "egress1"


def injector_image_name(bundle: AgentBundle) -> str:
    return f"{IMAGE_REPOSITORY}:{bundle.manifest.key}-{IMAGE_LAYOUT}"


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


def find_nft() -> Path:
    for candidate in (shutil.which("nft"), *NFT_CANDIDATES):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise BackendError("building the agent-injector image needs `nft` for the egress guard, which enforces "
                       "network 'none'/'allowlist' inside each Pod; install Debian's nftables "
                       "(apt-get install nftables)")


def build_injector_rootfs(bundle: AgentBundle, dest: Path) -> None:
    """Fill the empty directory `dest` with the injector's root file system."""
    bindir = dest / "bin"
    bindir.mkdir(parents=True)
    shutil.copy2(find_static_busybox(), bindir / "busybox")
    for applet in ("cp", "sh", "ls"):
        os.symlink("busybox", bindir / applet)
    shutil.copytree(bundle.path, dest / INJECTOR_BUNDLE_DIR.lstrip("/"), symlinks=True)
    add_egress_tool(dest)


def add_egress_tool(dest: Path) -> None:
    """`nft`, its libraries and loader under /egress, and /egress/apply RULESET: load the ruleset (one
    transaction), then print the guard's table (the container's log)."""
    nft = find_nft()
    egress = dest / EGRESS_DIR.lstrip("/")
    (egress / "bin").mkdir(parents=True)
    libdir = egress / "lib"
    libdir.mkdir()
    shutil.copyfile(nft, egress / "bin" / "nft")
    (egress / "bin" / "nft").chmod(0o755)
    loader = copy_native_libraries([nft], libdir)
    apply = dest / APPLY_SCRIPT.lstrip("/")
    apply.write_text(
        "#!/bin/sh\n"
        "# The egress guard: loads the sandbox's egress rules ($1, nft syntax) into the Pod's network\n"
        "# namespace before any other container of the Pod starts, then prints the table in force.\n"
        "set -eu\n"
        f"nft() {{ {EGRESS_DIR}/lib/{loader} --library-path {EGRESS_DIR}/lib {EGRESS_DIR}/bin/nft \"$@\"; }}\n"
        'nft "$1"\n'
        f"nft list chain inet {TABLE} {CHAIN}\n")
    apply.chmod(0o755)


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
