"""Debian packages for a self-contained tree (a harness bundle, the llama.cpp runtime), from deb.debian.org
only: apt-get with a private configuration (its own sources list, package lists, archive cache and an
*empty* dpkg status, so it resolves the whole closure of what is asked and installs nothing on this
machine), `--download-only`, then `dpkg-deb -x` of each package into the tree. No maintainer scripts run.

Why apt-get rather than debootstrap: the closure of `python3.13` alone is ~30 packages and ~20 MB fetched in
about a second, where a minbase debootstrap takes ~1 minute and 270 MB for tools the bundle never uses; apt
also verifies the archive's signature (the Debian archive keyring) and keeps the downloaded .debs for the
next build."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel

from orchard.core.errors import BackendError, InvalidRequest

DEFAULT_MIRROR = "http://deb.debian.org/debian"
ARCHITECTURE = "amd64"
# The Debian release whose `python3.X` each Python version is.
PYTHON_SUITES = {"3.11": "bookworm", "3.13": "trixie"}
KEYRINGS = ("/usr/share/keyrings/debian-archive-keyring.gpg",)
APT_TIMEOUT_S = 600


class DebianPackage(BaseModel):
    name: str
    version: str
    architecture: str


def suite_for(python: str) -> str:
    try:
        return PYTHON_SUITES[python]
    except KeyError:
        raise InvalidRequest(f"no Debian release here has Python {python}; harness bundles can have Python "
                             f"{', '.join(sorted(PYTHON_SUITES))}") from None


class AptCache:
    """apt's private state for one suite under `root` (package lists, downloaded archives), shared by every
    build of this machine and serialised by a lock file (apt's own locking is off: no root needed)."""

    def __init__(self, root: Path, suite: str, mirror: str = DEFAULT_MIRROR) -> None:
        self.root, self.suite, self.mirror = root / suite, suite, mirror

    @property
    def archives(self) -> Path:
        return self.root / "archives"

    def _options(self) -> list[str]:
        keyring = next((k for k in KEYRINGS if os.path.exists(k)), None)
        if keyring is None:
            raise BackendError("building a harness bundle needs the Debian archive keyring (to check what is "
                               f"downloaded): install the debian-archive-keyring package ({KEYRINGS[0]})")
        (self.root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (self.archives / "partial").mkdir(parents=True, exist_ok=True)
        status = self.root / "status"
        if not status.exists():
            status.touch()
        sources = self.root / "sources.list"
        sources.write_text(f"deb [signed-by={keyring}] {self.mirror} {self.suite} main\n")
        return ["-q", "-o", f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/dev/null",
                "-o", "Dir::Etc::Preferences=/dev/null", "-o", "Dir::Etc::PreferencesParts=/dev/null",
                "-o", f"Dir::State={self.root}", "-o", f"Dir::State::Lists={self.root / 'lists'}",
                "-o", f"Dir::State::status={status}", "-o", f"Dir::Cache={self.root}",
                "-o", f"Dir::Cache::archives={self.archives}", "-o", "Dir::Cache::pkgcache=",
                "-o", "Dir::Cache::srcpkgcache=", "-o", f"APT::Architecture={ARCHITECTURE}",
                "-o", f"APT::Architectures::={ARCHITECTURE}", "-o", "APT::Install-Recommends=0",
                "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def fetch(self, packages: list[str]) -> list[Path]:
        """Download `packages` and everything they depend on; the .deb files, in apt's install order."""
        with self.locked():
            options = self._options()
            self._apt(["update"], options, "update the Debian package lists")
            plan = self._apt(["install", "-s", *packages], options, "resolve the Debian packages", packages)
            chosen = [DebianPackage(name=m[0], version=m[1], architecture=m[2])
                      for m in re.findall(r"^Inst (\S+) \(([^ )]+) [^)\[]*\[([a-z0-9]+)\]\)", plan, re.M)]
            if not chosen:
                raise BackendError(f"apt-get chose no packages for {' '.join(packages)}:\n{plan[-2000:]}")
            self._apt(["install", "-y", "--download-only", *packages], options, "download the Debian packages",
                      packages)
            return [self._archive_of(p) for p in chosen]

    def _archive_of(self, package: DebianPackage) -> Path:
        version = package.version.replace(":", "%3a")
        path = self.archives / f"{package.name}_{version}_{package.architecture}.deb"
        if not path.is_file():
            raise BackendError(f"apt-get did not leave {path.name} in {self.archives}")
        return path

    def _apt(self, args: list[str], options: list[str], what: str, packages: list[str] | None = None) -> str:
        try:
            done = subprocess.run(["apt-get", *options, *args], capture_output=True, text=True,
                                  timeout=APT_TIMEOUT_S, env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError:
            raise BackendError("building a harness bundle needs apt-get and dpkg-deb (Debian's apt and dpkg "
                               "packages)") from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"apt-get could not {what} within {APT_TIMEOUT_S} s ({self.mirror})") from None
        if done.returncode != 0:
            missing = re.findall(r"Unable to locate package (\S+)|Package '?(\S+?)'? has no installation candidate",
                                 done.stderr)
            names = sorted({a or b for a, b in missing})
            if names:
                raise InvalidRequest(f"Debian {self.suite} has no package {', '.join(names)}; check the name "
                                     f"(https://packages.debian.org/{self.suite}/)")
            raise BackendError(f"apt-get could not {what} ({' '.join(packages or [])}) from {self.mirror}: "
                               f"{done.stderr.strip()[-2000:] or done.stdout.strip()[-2000:]}")
        return done.stdout


def extract(archives: list[Path], root: Path) -> None:
    """Unpack each .deb's files into `root` (no maintainer scripts)."""
    for deb in archives:
        done = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True)
        if done.returncode != 0:
            raise BackendError(f"dpkg-deb could not unpack {deb.name}: {done.stderr.strip()}; remove it from "
                               f"{deb.parent} to download it again")


def programs_of(deb: Path) -> list[str]:
    """The paths (relative, e.g. `usr/bin/rg`) of the programs a .deb installs in bin directories."""
    done = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True)
    found = []
    for line in done.stdout.splitlines():
        path = line.split()[-1] if line.startswith(("-", "l")) else ""
        if line.startswith("l"):
            path = line.split(" -> ")[0].split()[-1]
        path = path.removeprefix("./")
        if re.match(r"^(usr/)?s?bin/[^/]+$", path):
            found.append(path)
    return found
