"""Building a harness bundle (layout in docs/harness-bundles.md):

1. Debian: `python3.X`, Debian's pip wheel and the spec's extra packages, with everything they depend on,
   unpacked into the bundle (debian.py);
2. every program in it patched to the bundle's own loader and libraries at the fixed mount point (elf.py);
3. run *at its mount point*, inside a bubblewrap whose root is this machine's (read-only) with the bundle
   under construction bound at /.orchard/harness/<name>: the standard library byte-compiled, a venv made,
   the spec's pins installed into it by pip (the machine's pip configuration applies: index, CA), so that
   console-script shebangs and the venv's links name paths that exist in every sandbox;
4. `manifest.json` written last, and the directory renamed into place.

One build per key at a time (a lock file; a second builder waits and then finds it built). A build runs in a
temp dir that is only ever renamed into place complete, and is removed when it fails."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from orchard.core.errors import BackendError, InvalidRequest
from orchard.core.harness_bundle import VENV_DIR, HarnessBundleSpec
from orchard.sandbox.bubblewrap import find_bwrap
from orchard.util import debian
from orchard.sandbox.harness_bundles.elf import pin_programs
from orchard.sandbox.harness_bundles.store import (MANIFEST, BuiltBundle, HarnessBundleManifest, bundle_dir,
                                                   bundle_key, downloads_dir, read_built)

Progress = Callable[[str], None]
PIP_TIMEOUT_S = 1800
# Unpacked files no program reads: documentation, manuals, translations, dpkg's own leftovers.
PRUNED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale",
          "usr/share/bug", "var")
# The host's environment reaches pip (its index, CA and proxy settings) but nothing of Orchard's own Python.
ENV_DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD",
               "PYTHONUSERBASE", "PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_REQUIRE_VIRTUALENV")


def ensure_bundle(spec: HarnessBundleSpec, cache_dir: Path, progress: Progress = lambda step: None,
                  rebuild: bool = False, downloads: Path | None = None) -> BuiltBundle:
    """The built bundle of `spec` in `cache_dir`, building it first if needed (or with `rebuild`).
    `downloads` keeps the .debs, apt's lists and pip's cache (default `<cache_dir>/harness-downloads`)."""
    debian.suite_for(spec.python)  # an unsupported Python is refused before anything is made
    cache_dir.mkdir(parents=True, exist_ok=True)
    if not rebuild and (built := read_built(cache_dir, spec)) is not None:
        return built
    with _key_lock(cache_dir, spec):
        if rebuild:
            _retire(bundle_dir(cache_dir, spec))
        elif (built := read_built(cache_dir, spec)) is not None:
            return built  # another builder finished it while we waited
        _build(spec, cache_dir, downloads or downloads_dir(cache_dir), progress)
    built = read_built(cache_dir, spec)
    if built is None:
        raise BackendError(f"harness bundle {spec.name!r} was built but cannot be read back from {cache_dir}")
    return built


@contextmanager
def _key_lock(cache_dir: Path, spec: HarnessBundleSpec) -> Iterator[None]:
    locks = cache_dir / "harness-locks"
    locks.mkdir(exist_ok=True)
    with open(locks / f"{spec.name}-{bundle_key(spec)}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _retire(path: Path) -> None:
    """Move a published bundle aside and remove it. Sandboxes that mount it see its files go (a bind mount
    shares them): rebuild when none runs."""
    if path.exists():
        aside = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.rename(path, aside)
        shutil.rmtree(aside, ignore_errors=True)


def _build(spec: HarnessBundleSpec, cache_dir: Path, downloads: Path, progress: Progress) -> None:
    started = time.monotonic()
    final = bundle_dir(cache_dir, spec)
    for leftover in cache_dir.glob(f".{final.name}.*"):  # we hold the key's lock: these are abandoned
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache_dir))
    try:
        root, work = tmp / "bundle", tmp / "work"
        root.mkdir(mode=0o755)
        (work / "tmp").mkdir(parents=True)
        versions, programs = _debian_part(spec, root, downloads, progress)
        progress("pinning the bundle's programs to its own loader")
        pin_programs(root, spec.mount_point())
        python = f"usr/bin/python{spec.python}"
        builder = _Builder(spec, root, work, downloads / "pip")
        progress("byte-compiling the standard library")
        builder.run([python, "-m", "compileall", "-q", "-j0", f"usr/lib/python{spec.python}"],
                    "byte-compile the standard library")
        progress("making the venv")
        builder.run([python, "-m", "venv", "--without-pip", VENV_DIR], "make the venv")
        if spec.requirements:
            progress(f"installing {len(spec.requirements)} locked requirements with pip --no-deps" if spec.locked
                     else f"installing {', '.join(spec.requirements)} with pip")
            builder.pip_install(progress)
        installed = json.loads(builder.run(
            [f"{VENV_DIR}/bin/python", "-c", "import importlib.metadata as m, json; "
             "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"],
            "list the venv's distributions"))
        full_version = builder.run([python, "-c", "import platform; print(platform.python_version())"],
                                   "run the bundle's Python").strip()
        _check_entry(spec, root)
        progress("publishing")
        manifest = HarnessBundleManifest(
            key=bundle_key(spec), spec=spec, python_version=full_version, python=python, debian=versions,
            installed=dict(sorted(installed.items(), key=lambda kv: kv[0].lower())), programs=programs,
            build_seconds=round(time.monotonic() - started, 1), size_bytes=_size(root))
        (root / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        try:
            os.rename(root, final)
        except OSError as e:
            raise BackendError(f"could not publish harness bundle {spec.name!r} at {final}: {e}") from e
    except OSError as e:
        raise BackendError(f"could not build harness bundle {spec.name!r} in {cache_dir}: {e}; check that it "
                           "is writable and has room (bundles take 50-700 MB)") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _debian_part(spec: HarnessBundleSpec, root: Path, downloads: Path,
                 progress: Progress) -> tuple[dict[str, str], list[str]]:
    """Unpack the interpreter, Debian's pip wheel and the spec's packages; link the latter's programs into
    bin/. Returns the unpacked packages' versions and the linked programs."""
    suite = debian.suite_for(spec.python)
    apt = debian.AptCache(downloads / "debian", suite)
    wanted = [f"python{spec.python}", "python3-pip-whl", *spec.debian_packages]
    progress(f"fetching {', '.join(wanted)} and their dependencies from Debian {suite}")
    archives = apt.fetch(wanted)
    progress(f"unpacking {len(archives)} Debian packages")
    debian.extract(archives, root)
    for pruned in PRUNED:
        shutil.rmtree(root / pruned, ignore_errors=True)
    _ca_bundle(root)
    versions = {}
    for deb in archives:
        name, version, _ = deb.name.rsplit("_", 2)
        versions[name] = version.replace("%3a", ":")
    programs = []
    extra = {deb.name.split("_")[0]: deb for deb in archives}
    for package in spec.debian_packages:
        for program in debian.programs_of(extra[package]):
            link = root / "bin" / Path(program).name
            link.parent.mkdir(exist_ok=True)
            if not link.exists():
                link.symlink_to(f"../{program}")
                programs.append(f"bin/{link.name}")
    return versions, programs


def _ca_bundle(root: Path) -> None:
    """What ca-certificates' maintainer script would make (none run): one PEM file of Mozilla's CAs, for a
    harness that calls out over TLS (`SSL_CERT_FILE={bundle}/etc/ssl/certs/ca-certificates.crt`); the
    bundle's OpenSSL otherwise looks in the task image's /usr/lib/ssl."""
    certificates = sorted((root / "usr/share/ca-certificates").rglob("*.crt"))
    if certificates:
        target = root / "etc/ssl/certs/ca-certificates.crt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"".join(c.read_bytes().rstrip(b"\n") + b"\n" for c in certificates))


def _check_entry(spec: HarnessBundleSpec, root: Path) -> None:
    if spec.entry and "/" not in spec.entry[0] and "{" not in spec.entry[0]:
        program = root / VENV_DIR / "bin" / spec.entry[0]
        if not os.path.lexists(program):
            raise InvalidRequest(f"harness bundle {spec.name!r}: its entry program {spec.entry[0]!r} is not in the "
                                 "venv after installing its requirements; check `entry` against the console "
                                 "scripts the packages install")


def _size(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
    return total


class _Builder:
    """Runs commands of the bundle under construction at its mount point: a bubblewrap whose root is this
    machine's, read-only, with the bundle bound read-write at /.orchard/harness/<name> and the work and pip
    cache directories writable at their own paths."""

    def __init__(self, spec: HarnessBundleSpec, root: Path, work: Path, pip_cache: Path) -> None:
        self.spec, self.root, self.work, self.pip_cache = spec, root, work, pip_cache
        self.mount = spec.mount_point()
        pip_cache.mkdir(parents=True, exist_ok=True)
        self.bwrap = find_bwrap()

    def _argv(self, command: list[str]) -> list[str]:
        argv = [self.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                "--tmpfs", "/"]
        for entry in sorted(os.scandir("/"), key=lambda e: e.name):
            if entry.name in ("proc", "dev", "tmp"):
                continue
            if entry.is_symlink():
                argv += ["--symlink", os.readlink(entry.path), f"/{entry.name}"]
            elif entry.is_dir() or entry.is_file():
                argv += ["--ro-bind", entry.path, f"/{entry.name}"]
        # A /tmp of its own first (short socket paths for multiprocessing), then the writable paths, which
        # may lie under the host's /tmp (their mount points are made in the build's own work dir).
        argv += ["--dev", "/dev", "--proc", "/proc", "--bind", str(self.work / "tmp"), "/tmp",
                 "--bind", str(self.work), str(self.work),
                 "--bind", str(self.pip_cache), str(self.pip_cache), "--bind", str(self.root), self.mount,
                 "--remount-ro", "/", "--chdir", self.mount, "--"]
        first = command[0] if command[0].startswith("/") else f"{self.mount}/{command[0]}"
        return argv + [first, *command[1:]]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED}
        env.update(TMPDIR="/tmp", LC_ALL="C.UTF-8")  # HOME stays: the user's pip configuration applies
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # the bundle is read-only in sandboxes: compile now
        return env

    def run(self, command: list[str], what: str, timeout: float = 600) -> str:
        try:
            done = subprocess.run(self._argv(command), capture_output=True, text=True, env=self._env(),
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BackendError(f"harness bundle {self.spec.name!r}: could not {what} within {timeout:g} s") from None
        if done.returncode != 0:
            raise BackendError(f"harness bundle {self.spec.name!r}: could not {what} (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-3000:]}")
        return done.stdout

    def pip_install(self, progress: Progress) -> None:
        """pip's output is read as it comes: what it is collecting is the build's progress (resolving a
        big harness can take minutes), and its end is the error when it fails."""
        wheels = sorted((self.root / "usr/share/python-wheels").glob("pip-*.whl"))
        if not wheels:
            raise BackendError("Debian's pip wheel (python3-pip-whl) was not unpacked into the bundle")
        requirements = self.work / "requirements.txt"
        requirements.write_text("".join(f"{r}\n" for r in self.spec.requirements))
        command = [f"{VENV_DIR}/bin/python", f"{self.mount}/usr/share/python-wheels/{wheels[-1].name}/pip",
                   "install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location",
                   "--progress-bar", "off", "--root-user-action", "ignore", "--cache-dir", str(self.pip_cache),
                   *(["--no-deps"] if self.spec.locked else []), "-r", str(requirements)]
        proc = subprocess.Popen(self._argv(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self._env())
        timer = threading.Timer(PIP_TIMEOUT_S, proc.kill)
        timer.start()
        output: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                output.append(line)
                if line.startswith(("Collecting ", "Installing collected")):
                    progress(f"pip: {line.strip()[:100]}")
            proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            if proc.returncode == -9:
                raise BackendError(f"harness bundle {self.spec.name!r}: pip did not finish within {PIP_TIMEOUT_S} s")
            raise _pip_error(self.spec, "".join(output[-400:]))


def _pip_error(spec: HarnessBundleSpec, output: str) -> Exception:
    """The user's error when a requirement cannot be had (naming it), else the backend's with pip's tail."""
    missing = re.search(r"No matching distribution found for (\S+)", output)
    if missing:
        versions = re.search(r"Could not find a version that satisfies the requirement \S+ \((from versions: "
                             r"[^)]*)\)", output)
        return InvalidRequest(
            f"harness bundle {spec.name!r}: pip cannot install {missing.group(1)} for Python {spec.python}"
            + (f" ({versions.group(1)[:300]})" if versions else "")
            + "; fix the pin in the bundle's spec")
    if "ResolutionImpossible" in output or "conflicting dependencies" in output:
        return InvalidRequest(f"harness bundle {spec.name!r}: its pins conflict: {output.strip()[-1500:]}")
    return BackendError(f"harness bundle {spec.name!r}: pip failed: {output.strip()[-3000:]}")
