"""What a task needs built: its Dockerfile and build context, carried in the task itself (so the suite's
content hash covers them) under BUILD_KEY in its metadata, and the name of the image it builds, which holds
the content hash of both: an image already built under that name is the cache."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

BUILD_KEY = "orchard.image_build"  # Task.metadata: the ImageBuild of a task whose image is built first
IMAGE_REPOSITORY = "orchard-build"


class ImageBuild(BaseModel):
    image: str = Field(description="the built image's name: orchard-build/<task>:<content hash>")
    dockerfile: str
    context: str = Field(description="base64 of the build context as a gzipped tar")

    def context_bytes(self) -> bytes:
        return gzip.decompress(base64.b64decode(self.context))


def context_tar(directory: Path) -> bytes:
    """The directory as a tar whose bytes depend only on the files' paths, modes and contents."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, names in os.walk(directory):
            dirs.sort()
            for name in sorted(names):
                path = Path(top, name)
                if path.is_symlink() or not path.is_file():
                    continue
                info = tarfile.TarInfo(path.relative_to(directory).as_posix())
                data = path.read_bytes()
                info.size, info.mode, info.mtime = len(data), path.stat().st_mode & 0o777, 0
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def image_build(task_id: str, dockerfile: str, context_dir: Path) -> ImageBuild:
    tar = context_tar(context_dir)
    digest = hashlib.sha256(dockerfile.encode() + b"\0" + tar).hexdigest()[:16]
    return ImageBuild(image=f"{IMAGE_REPOSITORY}/{task_id.lower()}:{digest}", dockerfile=dockerfile,
                      context=base64.b64encode(gzip.compress(tar, mtime=0)).decode("ascii"))


def build_of(metadata: dict[str, Any]) -> ImageBuild | None:
    raw = metadata.get(BUILD_KEY)
    return ImageBuild.model_validate(raw) if raw else None
