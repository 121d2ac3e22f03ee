"""Before a run or a validation: the images of the tasks that build theirs (a Harbor task with
environment/Dockerfile and no prebuilt image), each built once, on the backend that will run them: `docker
build` on the Docker backend, the daemon-less builder (local.py) on the local one. An image already there
under its content-hash name is not built again. A task whose image cannot be built (an instruction the local
builder does not take, a base image that is not there, a RUN that fails) is not runnable, with the reason:
the other tasks run."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path
from typing import Any

from orchard.core.backend import BackendConfig
from orchard.core.errors import InvalidRequest, OrchardError
from orchard.core.home import resolve_home
from orchard.core.sandbox import SandboxFactory
from orchard.core.task import Task
from orchard.eval.image_build.dockerfile import DockerfileError
from orchard.eval.image_build.local import BuildError, build_locally
from orchard.eval.image_build.spec import ImageBuild, build_of
from orchard.eval.load_errors import LOAD_ERROR_KEY
from orchard.sandbox.client import AsyncOrchard
from orchard.sandbox.images import ImageStore
from orchard.sandbox.server.home import resolved_backend_config


async def prepare_task_images(tasks: list[Task], *, backend: BackendConfig | str | None = None,
                              orchard_url: str | None = None,
                              client: SandboxFactory | None = None) -> list[Task]:
    """`tasks`, each whose image could not be built made not runnable (with the reason)."""
    builds = {build.image: build for task in tasks if not task.metadata.get(LOAD_ERROR_KEY)
              for build in [build_of(task.metadata)] if build is not None}
    if not builds:
        return tasks
    problems: dict[str, str] = {}
    if orchard_url:
        problems = {image: "its image is built from environment/Dockerfile, which only an embedded orchestrator "
                           "does (--backend local or docker, no --url)" for image in builds}
    else:
        config = resolved_backend_config(backend, resolve_home())
        if config.backend == "local":
            problems = await _build_local(builds, config, client)
        elif config.backend == "docker":
            problems = await asyncio.to_thread(_build_docker, builds, config)
        else:
            problems = {image: f"its image is built from environment/Dockerfile, which the {config.backend} backend "
                               "cannot do here (the local and docker backends build it)" for image in builds}
    return [_unrunnable(task, problems[build.image]) if build is not None and build.image in problems else task
            for task in tasks for build in [build_of(task.metadata)]]


def _unrunnable(task: Task, problem: str) -> Task:
    return task.model_copy(update={"metadata": {**task.metadata, LOAD_ERROR_KEY: f"task {task.id}: {problem}"}})


async def _build_local(builds: dict[str, ImageBuild], config: BackendConfig,
                       client: SandboxFactory | None) -> dict[str, str]:
    store = ImageStore(Path(getattr(config, "image_dir", None) or resolve_home() / "images"))
    missing = {}
    for image, build in builds.items():
        try:
            store.resolve(image)
        except InvalidRequest:  # not imported (nor built) yet
            missing[image] = build
    if not missing:
        return {}
    problems: dict[str, str] = {}

    async def one(orch: SandboxFactory, image: str, build: ImageBuild) -> None:
        try:
            await build_locally(build, orch, store)
        except (BuildError, DockerfileError, OrchardError) as exc:
            problems[image] = f"its image cannot be built from environment/Dockerfile: {exc}"

    if client is not None:
        await asyncio.gather(*(one(client, image, build) for image, build in missing.items()))
    else:
        async with AsyncOrchard(backend=config) as orch:
            await asyncio.gather(*(one(orch, image, build) for image, build in missing.items()))
    return problems


def _build_docker(builds: dict[str, ImageBuild], config: Any) -> dict[str, str]:
    """`docker build` of each context (with its Dockerfile) through the daemon's Engine API."""
    try:
        import docker
    except ImportError as exc:
        return {image: f"its image needs `docker build`, but the docker SDK is not installed ({exc}; pip install "
                       "-e '.[docker]')" for image in builds}

    problems: dict[str, str] = {}
    api = docker.APIClient(base_url=config.base_url, version="auto", timeout=1800)
    try:
        for image, build in builds.items():
            try:
                api.inspect_image(image)
                continue
            except docker.errors.ImageNotFound:
                pass
            try:
                for event in api.build(fileobj=_docker_context(build), custom_context=True, tag=image, rm=True,
                                       forcerm=True, decode=True):
                    if "error" in event:
                        problems[image] = f"docker build failed: {' '.join(str(event['error']).split())[-300:]}"
                        break
            except docker.errors.DockerException as exc:
                problems[image] = f"docker build failed: {exc}"
    finally:
        api.close()
    return problems


def _docker_context(build: ImageBuild) -> io.BytesIO:
    """The build context with its Dockerfile, as the tar the Engine API takes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out, tarfile.open(fileobj=io.BytesIO(build.context_bytes())) as src:
        for member in src.getmembers():
            if member.name != "Dockerfile":
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
        data = build.dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        out.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer
