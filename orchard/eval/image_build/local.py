"""The local backend's image builder, with no daemon: a Dockerfile's steps (dockerfile.py) run in a build
sandbox made from the base image (which must be in the local image store: the project's own Debian image
answers to debian:bookworm and debian:bookworm-slim), each RUN as a command there with the ENV and ARG
values and the WORKDIR so far, each COPY written from the build context; then the sandbox's whole root file
system (its own mounts left out) is packed as the one layer of an OCI image, with the base's environment
plus ENV and the last WORKDIR, and imported into the store under the build's name. The sandbox is deleted
whatever happens."""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from orchard.core.errors import InvalidRequest
from orchard.core.sandbox import NetworkPolicy, Sandbox, SandboxFactory, SandboxSpec
from orchard.eval.image_build.dockerfile import Step, parse
from orchard.eval.image_build.spec import ImageBuild
from orchard.sandbox.backends.local.bwrap import image_ids
from orchard.sandbox.images import ImageStore

RUN_TIMEOUT_S = 1800.0
SNAPSHOT = "/tmp/.orchard-build-rootfs.tar"
SNAPSHOT_COMMAND = (f"tar --one-file-system --numeric-owner -cpf {SNAPSHOT} --exclude=.{SNAPSHOT} -C / . ; "
                    "status=$?; [ $status -le 1 ]")  # 1: a file changed while read (a log); still whole
MAX_ROOTFS_BYTES = 16 << 30


class BuildError(Exception):
    """The image cannot be built; the message says which line and why."""


def base_of(steps: list[Step]) -> str:
    return next(step.args[0] for step in steps if step.kind == "FROM")


async def build_locally(build: ImageBuild, orch: SandboxFactory, store: ImageStore) -> None:
    steps = parse(build.dockerfile)
    base = base_of(steps)
    try:
        record = store.resolve(base)
    except InvalidRequest:
        raise BuildError(f"its base image {base} is not in the local image store (import it: `orchard image import "
                         f"ARCHIVE --name {base}`)") from None
    sandbox = await orch.create(SandboxSpec(image=base, workdir="/", network=NetworkPolicy(mode="open"),
                                            timeout_s=RUN_TIMEOUT_S * 2))
    try:
        env, workdir = await _run_steps(sandbox, steps, build.context_bytes())
        snapshot = await sandbox.exec(["sh", "-c", SNAPSHOT_COMMAND], timeout=RUN_TIMEOUT_S)
        if snapshot.exit_code != 0:
            raise BuildError(f"packing the built file system failed: {' '.join(snapshot.output.split())[-300:]}")
        with tempfile.TemporaryDirectory(prefix="orchard-build-", dir=store.root.parent) as scratch:
            layer = Path(scratch, "rootfs.tar")
            await sandbox.download(SNAPSHOT, layer, max_bytes=MAX_ROOTFS_BYTES)
            base_env = [entry for entry in record.config.env if entry.partition("=")[0] not in env]
            layout = _oci_layout(Path(scratch, "layout"), layer, [*base_env, *(f"{k}={v}" for k, v in env.items())],
                                 workdir)
            store.import_archive(layout, name=build.image, ids=image_ids())
    finally:
        await sandbox.close()


async def _run_steps(sandbox: Sandbox, steps: list[Step], context: bytes) -> tuple[dict[str, str], str]:
    """Run the steps; the image's ENV and its last WORKDIR."""
    env: dict[str, str] = {}
    build_args: dict[str, str] = {}
    cwd = "/"
    for step in steps:
        if step.kind == "ENV":
            env[step.args[0]] = step.args[1]
        elif step.kind == "ARG":
            build_args[step.args[0]] = step.args[1]
        elif step.kind == "WORKDIR":
            cwd = posixpath.normpath(posixpath.join(cwd, step.args[0]))
            await _checked(sandbox, step, ["mkdir", "-p", cwd], "/", {})
        elif step.kind == "RUN":
            await _checked(sandbox, step, ["/bin/sh", "-c", step.args[0]], cwd, {**build_args, **env})
        elif step.kind == "COPY":
            await _copy(sandbox, step, context, cwd)
    return env, cwd


async def _checked(sandbox: Sandbox, step: Step, argv: list[str], cwd: str, env: dict[str, str]) -> None:
    result = await sandbox.exec(argv, cwd=cwd, env=env, timeout=RUN_TIMEOUT_S)
    if result.exit_code != 0 or result.timed_out:
        what = "timed out" if result.timed_out else f"failed with exit code {result.exit_code}"
        raise BuildError(f"line {step.line}: {step.kind} {' '.join(step.args)[:120]} {what}: "
                         f"{' '.join(result.output.split())[-300:]}")


async def _copy(sandbox: Sandbox, step: Step, context: bytes, cwd: str) -> None:
    *sources, destination = step.args
    target = posixpath.join(cwd, destination)
    into_dir = destination.endswith("/") or len(sources) > 1
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        members = [member for member in tar.getmembers() if member.isfile()]
        for source in sources:
            root = PurePosixPath(posixpath.normpath(source.lstrip("/")))
            if str(root).startswith(".."):
                raise BuildError(f"line {step.line}: COPY {source} is outside the build context")
            matched = False
            for member in members:
                path = PurePosixPath(member.name)
                if str(root) == ".":
                    relative = path
                elif path == root:
                    relative = PurePosixPath(root.name) if into_dir else None
                elif root in path.parents:
                    relative = path.relative_to(root)
                else:
                    continue
                matched = True
                where = posixpath.join(target, str(relative)) if relative is not None else target
                data = tar.extractfile(member).read()
                await sandbox.write_file(where, data, mode=member.mode & 0o777)
            if not matched:
                raise BuildError(f"line {step.line}: COPY {source}: no such file in the build context")


def _blob(root: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}"


def _oci_layout(root: Path, layer: Path, env: list[str], workdir: str) -> Path:
    """An OCI image layout of one uncompressed layer (moved in, not copied) and its config."""
    (root / "blobs" / "sha256").mkdir(parents=True)
    digest = hashlib.sha256()
    with open(layer, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    layer_digest, layer_size = f"sha256:{digest.hexdigest()}", layer.stat().st_size
    os.replace(layer, root / "blobs" / "sha256" / digest.hexdigest())
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": env, "WorkingDir": workdir},
                         "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": _blob(root, config), "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                                       "size": layer_size}]}).encode()
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _blob(root, manifest),
         "size": len(manifest)}]}))
    return root
