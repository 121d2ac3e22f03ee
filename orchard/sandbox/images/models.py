"""What the image store keeps on disk: one record per imported image, and the index of names."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class IdMap(BaseModel):
    """How an image's uids and gids become the host's: image id N is host id `base + N` (ids at or past
    `count` become `base + count - 1`, the sandbox's nobody). None in a record: files belong to whoever
    imported the image (an unprivileged user cannot give files away)."""

    model_config = ConfigDict(frozen=True)
    base: int
    count: int

    def host(self, image_id: int) -> int:
        return self.base + min(image_id, self.count - 1)


class ImageConfig(BaseModel):
    """The parts of an OCI image config a sandbox may use."""

    env: list[str] = Field(default_factory=list)
    working_dir: str = ""
    user: str = ""
    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)


class ImageRecord(BaseModel):
    """One imported image: `digest` is its key (the manifest's digest; for a docker archive without an
    OCI manifest, the config's, which is docker's image id)."""

    digest: str
    format: str  # "oci" or "docker-archive"
    layers: list[str]  # the layer blobs' digests, lowest first
    size_bytes: int  # the layers as read (compressed where they are)
    config: ImageConfig = Field(default_factory=ImageConfig)
    ids: IdMap | None = None
    imported_at: float = 0.0
    skipped: list[str] = Field(default_factory=list)  # device nodes, xattrs it could not set (the first 20)


class ImageIndex(BaseModel):
    """The names that point at imported images: `repo:tag` -> digest."""

    names: dict[str, str] = Field(default_factory=dict)
