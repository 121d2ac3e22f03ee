"""Where built harness bundles live and how a backend finds them.

    <cache>/harness-<name>-<key>/       one built bundle (read-only once published), `manifest.json` last
    <cache>/.harness-<name>-<key>.*/    a build in progress (a temp dir, renamed into place when complete)
    <cache>/harness-downloads/          .debs and apt lists per Debian suite, pip's wheel cache
    <cache>/harness-locks/              one lock file per key: concurrent builders of a bundle wait, not race

`key` hashes everything a bundle is made from that is known before building it: the spec, the bundle format
and the Debian inputs (suite, mirror, architecture). What a build actually got (every .deb's version, every
installed distribution) is recorded in the manifest."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from pydantic import BaseModel, Field

from orchard.core.errors import InvalidRequest
from orchard.core.harness_bundle import HarnessBundleSpec, bundle_spec_names, get_bundle_spec
from orchard.util.debian import ARCHITECTURE, DEFAULT_MIRROR, suite_for

HARNESS_BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"


class HarnessBundleManifest(BaseModel):
    """`manifest.json` of a built bundle; paths relative to its root."""

    format: int = HARNESS_BUNDLE_FORMAT
    key: str
    spec: HarnessBundleSpec
    python_version: str = Field(description="the interpreter's full version, e.g. 3.13.5")
    python: str = Field(description="the interpreter, e.g. usr/bin/python3.13")
    venv: str = "venv"
    debian: dict[str, str] = Field(description="every Debian package unpacked, name -> version")
    installed: dict[str, str] = Field(description="every distribution in the venv, name -> version")
    programs: list[str] = Field(default_factory=list, description="bin/ links to the extra Debian packages' programs")
    build_seconds: float
    size_bytes: int


class BuiltBundle(BaseModel):
    path: Path
    manifest: HarnessBundleManifest


def bundle_key(spec: HarnessBundleSpec, mirror: str = DEFAULT_MIRROR) -> str:
    h = hashlib.sha256(f"format={HARNESS_BUNDLE_FORMAT}\nsuite={suite_for(spec.python)}\nmirror={mirror}\n"
                       f"arch={ARCHITECTURE}\n".encode())
    # `locked` counts only when set, so the keys (and built bundles) of specs that never lock stay as they were
    h.update(spec.model_dump_json(exclude=None if spec.locked else {"locked"}).encode())
    return h.hexdigest()[:16]


def bundle_dir(cache_dir: Path, spec: HarnessBundleSpec) -> Path:
    return cache_dir / f"harness-{spec.name}-{bundle_key(spec)}"


def downloads_dir(cache_dir: Path) -> Path:
    return cache_dir / "harness-downloads"


def read_built(cache_dir: Path, spec: HarnessBundleSpec) -> BuiltBundle | None:
    """The built bundle of `spec` in `cache_dir`, or None."""
    path = bundle_dir(cache_dir, spec)
    try:
        manifest = HarnessBundleManifest.model_validate_json((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return BuiltBundle(path=path, manifest=manifest)


_memo_lock = threading.Lock()
_memo: dict[tuple[Path, str], BuiltBundle] = {}


def require_built(names: list[str], cache_dir: Path) -> list[BuiltBundle]:
    """The built bundles a sandbox spec names, in order; InvalidRequest for a name no spec has (listing the
    known ones) or one not built in `cache_dir` (saying how to build it). Found bundles are remembered:
    a published bundle never changes."""
    found = []
    for name in names:
        with _memo_lock:
            memo = _memo.get((cache_dir, name))
        if memo is not None and memo.path.is_dir():
            found.append(memo)
            continue
        spec = get_bundle_spec(name)
        built = read_built(cache_dir, spec)
        if built is None:
            raise InvalidRequest(f"harness bundle {name!r} is not built on this server; build it with "
                                 f"`orchard harness build {name}` (into {cache_dir})")
        with _memo_lock:
            _memo[(cache_dir, name)] = built
        found.append(built)
    return found


def known_bundles() -> list[str]:
    return bundle_spec_names()
