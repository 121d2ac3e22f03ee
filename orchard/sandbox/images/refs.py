"""How images are referred to: `oci:NAME` (the prefix says "an OCI image" where a bare NAME could be
mistaken for something else; every backend reads it as NAME), names as docker spells them."""

from __future__ import annotations

import re

from orchard.core.errors import InvalidRequest

OCI_PREFIX = "oci:"
# A name as docker spells one: [registry[:port]/]path[:tag]; no spaces, no '@' (digests are refs of their own).
_NAME = re.compile(r"^[a-z0-9][a-z0-9._/:-]*$")


def strip_oci_prefix(image: str) -> str:
    """`oci:NAME` -> NAME; anything else as it is."""
    return image[len(OCI_PREFIX):] if image.startswith(OCI_PREFIX) else image


def normal_name(name: str) -> str:
    """A name with its tag: `repo` means `repo:latest`, as docker and Kubernetes read it."""
    name = name.strip()
    if not name or not _NAME.match(name) or name.startswith(("sha256:", "sha512:")):
        raise InvalidRequest(f"{name!r} is not a valid image name: use lowercase letters, digits and . _ - / :, "
                             "as in 'localhost/swe-task:latest'")
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def name_variants(name: str) -> list[str]:
    """`name` and how docker and Kubernetes also spell it: `debian:12` is `docker.io/library/debian:12`,
    `user/app:1` is `docker.io/user/app:1` (and the other way round)."""
    for prefix in ("docker.io/library/", "docker.io/"):
        if name.startswith(prefix) and (prefix == "docker.io/library/" or "/" in name[len(prefix):]):
            return [name, name[len(prefix):]]
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return [name]  # it names its registry
    return [name, ("docker.io/" if "/" in name else "docker.io/library/") + name]
