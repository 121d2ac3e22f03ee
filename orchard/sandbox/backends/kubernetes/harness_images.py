"""Harness bundles as Kubernetes injector images: a static busybox (for `cp`) plus the built bundle at
/bundle, imported into the dev cluster's containerd without a registry (`cluster.sh import-image`, which
also caches the archive, so every later `cluster.sh up` imports it again). The Kubernetes backend names the
image after the bundle's spec (harness.py). Part of the Kubernetes backend, it builds on the harness bundles
(orchard/sandbox/harness_bundles), which know no backend.

    python -m orchard.sandbox.backends.kubernetes.harness_images --import-with scripts/k8s/cluster.sh \
        [NAME ...]

With no NAME: every registered bundle that is built here (none built, nothing to do: cheap where the big
ones are not wanted); `--build` (or ORCHARD_K8S_BUILD_BUNDLES=1) builds the named ones, or all, first.
For a real cluster, push the same root file system as a one-layer image under the printed name."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchard.core.errors import BackendError, OrchardError
from orchard.core.harness_bundle import bundle_spec_names, get_bundle_spec
from orchard.sandbox.backends.kubernetes.harness import INJECTOR_BUNDLE_DIR, harness_image_name, injector_command
from orchard.sandbox.backends.kubernetes.images import find_static_busybox
from orchard.sandbox.bundle import default_cache_dir
from orchard.sandbox.harness_bundles.build import ensure_bundle
from orchard.sandbox.harness_bundles.store import BuiltBundle, read_built

BUILD_ENV = "ORCHARD_K8S_BUILD_BUNDLES"


def build_injector_rootfs(built: BuiltBundle, dest: Path) -> None:
    """Fill the new directory `dest` with the injector's root file system."""
    bindir = dest / "bin"
    bindir.mkdir(parents=True)
    shutil.copy2(find_static_busybox(), bindir / "busybox")
    for applet in ("cp", "sh"):
        os.symlink("busybox", bindir / applet)
    shutil.copytree(built.path, dest / INJECTOR_BUNDLE_DIR.lstrip("/"), symlinks=True)


def import_harness_image(import_script: Path, built: BuiltBundle) -> str:
    """Build the image of `built` and import it with `bash IMPORT_SCRIPT import-image NAME ROOTFS
    ENTRYPOINT`; returns the image name."""
    spec = built.manifest.spec
    name = harness_image_name(spec)
    with tempfile.TemporaryDirectory(prefix="orchard-harness-image.") as tmp:
        rootfs = Path(tmp) / "rootfs"
        build_injector_rootfs(built, rootfs)
        result = subprocess.run(["bash", str(import_script), "import-image", name, str(rootfs),
                                 json.dumps(injector_command(spec))], capture_output=True, text=True)
    if result.returncode != 0:
        raise BackendError(f"importing {name} with {import_script} failed (exit {result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-2000:]}")
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Import harness bundles into the dev cluster as injector images.")
    parser.add_argument("names", nargs="*", help="bundles (default: every registered one that is built)")
    parser.add_argument("--import-with", type=Path, required=True, metavar="SCRIPT",
                        help="scripts/k8s/cluster.sh (its `import-image`)")
    parser.add_argument("--build", action="store_true", default=os.environ.get(BUILD_ENV) == "1",
                        help=f"build what is not built first ({BUILD_ENV}=1)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default $ORCHARD_HOME/cache")
    args = parser.parse_args(argv)
    cache = args.cache_dir or default_cache_dir()
    failed = 0
    for name in args.names or bundle_spec_names():
        try:
            spec = get_bundle_spec(name)
            built = ensure_bundle(spec, cache) if args.build else read_built(cache, spec)
            if built is None:
                if args.names:
                    raise BackendError(f"harness bundle {name!r} is not built: `orchard harness build {name}` "
                                       f"(or pass --build)")
                print(f"skipped {name}: not built (orchard harness build {name}, or {BUILD_ENV}=1)")
                continue
            print(f"imported {import_harness_image(args.import_with, built)}")
        except OrchardError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
