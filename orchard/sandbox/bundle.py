"""The agent bundle: the in-sandbox agent plus a Python runtime that needs nothing from the image.

Layout (one directory, mounted read-only into sandboxes, by default at `/.orchard`):

    orchard_agent/          copy of `orchard/sandbox/agent/` (byte-compiled)
    runtime/bin/python3     this interpreter's real binary
    runtime/lib/            every shared library `ldd` names for it and the kept extension modules,
                            plus the dynamic loader its PT_INTERP names
    runtime/lib/pythonX.Y/  the standard library, pruned (tests, GUI, packaging, site-packages)
    run/                    empty mount point for the per-sandbox socket directory
    harness/                empty mount point for harness bundles (a small tmpfs holding their mounts)
    manifest.json           `BundleManifest`

The agent is started THROUGH the bundled loader with `--library-path`, so neither the image's libc nor
its Python (if it has one) is ever touched, and the commands the agent runs still see the image's own
libraries (no LD_LIBRARY_PATH leaks to them). Bundles are built once per (agent sources, interpreter)
and cached; a build happens in a temporary directory that is renamed into place, so concurrent builders
never see or publish half a bundle.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from pydantic import BaseModel

from orchard.core.errors import BackendError
from orchard.core.home import resolve_home

BUNDLE_FORMAT = 3  # 2: the empty harness/ mount point; 3: its content hash beside it (CONTENT_HASH_SUFFIX)
AGENT_PACKAGE = "orchard_agent"
AGENT_SOURCE_DIR = Path(__file__).resolve().parent / "agent"
DEFAULT_MOUNT_POINT = "/.orchard"
# `agent-bundle-<key>` + this: the hash of the bundle's files, written when it is built. Beside the bundle,
# not in it: a sandbox sees only the bundle, so it can never rewrite the hash that root checks the bundle
# against before the agent zygote runs it on the host (`verify_content`).
CONTENT_HASH_SUFFIX = ".sha256"
HASH_FILE_WAIT_S = 5.0

# Stdlib parts the agent never imports: tests, GUI, packaging tools, docs, the static-library build kit.
PRUNED_STDLIB_DIRS = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip",
                      "lib2to3", "site-packages", "dist-packages", "pydoc_data"}
PRUNED_STDLIB_PREFIXES = ("config-",)
# Extension modules left out: test/demo modules, GUI and terminal UIs, legacy Unix databases, and the
# ones dragging in large libraries the agent (plain HTTP, no TLS, no SQL) has no use for; hashlib falls
# back to its builtin digests without _hashlib.
PRUNED_EXTENSION_PREFIXES = ("_test", "_xx", "xx", "_ctypes_test", "_tkinter", "_curses", "readline",
                             "nis", "spwd", "ossaudiodev", "_crypt", "_sqlite3", "_ssl", "_hashlib",
                             "_dbm", "_gdbm")
# Libraries that must come from the kernel, never a file.
VIRTUAL_LIBRARIES = ("linux-vdso.so", "linux-gate.so")


# How the bundled interpreter starts: isolated (-I: no PYTHON* variable is read, no user site, the start
# directory not on sys.path), no site module (-S), no bytecode written (-B). Nothing in the environment
# can then change what it loads: only the bundle's standard library (found from the interpreter's own
# place, runtime/bin -> runtime/lib) and the agent package, which the launcher puts on sys.path.
INTERPRETER_FLAGS = ("-I", "-S", "-B", "-X", "utf8")


def agent_launcher(package: str = AGENT_PACKAGE, mount_point: str = DEFAULT_MOUNT_POINT,
                   entry: str = "__main__", call: str = "main()") -> str:
    """The `-c` program that starts the agent from the bundle at `mount_point`. Not `-m PACKAGE`: runpy
    and what it imports are ~1 ms of every start, and `-m` puts the directory the interpreter starts in (a
    sandbox's workdir, which its workload writes) first on sys.path, where the agent's later imports
    (tempfile, tarfile, ...) would find the workload's modules instead of the standard library's. `-I`
    adds no such entry; any empty one is dropped all the same, and the bundle's root goes first (not
    PYTHONPATH, which -I ignores)."""
    return (f"import sys; sys.path[:] = [{mount_point!r}] + [p for p in sys.path if p]; "
            f"from {package}.{entry} import {call.split('(')[0]}; {call}")


class BundleManifest(BaseModel):
    """Written as `manifest.json`; paths are relative to the bundle root."""

    format: int = BUNDLE_FORMAT
    key: str
    python_version: str
    python: str = "runtime/bin/python3"
    home: str = "runtime"
    library_dir: str = "runtime/lib"
    loader: str
    agent_package: str = AGENT_PACKAGE
    content_hash: str = ""  # `content_hash()` of the bundle when built (the copy beside it is the one trusted)


class AgentBundle(BaseModel):
    """A built bundle on this host and how to start the agent from wherever it is mounted."""

    path: Path
    manifest: BundleManifest

    def launch_argv(self, listen: str, workdir: str, mount_point: str = DEFAULT_MOUNT_POINT) -> list[str]:
        """The agent's command line, for a bundle mounted at `mount_point` inside the sandbox."""
        m = self.manifest
        return [*self.interpreter_argv(mount_point), "-c", agent_launcher(m.agent_package, mount_point),
                "--listen", listen, "--workdir", workdir]

    def interpreter_argv(self, mount_point: str = DEFAULT_MOUNT_POINT) -> list[str]:
        """The bundled interpreter, started through the bundled loader (`--library-path` replaces any
        LD_LIBRARY_PATH), with INTERPRETER_FLAGS."""
        m = self.manifest
        return [f"{mount_point}/{m.loader}", "--library-path", f"{mount_point}/{m.library_dir}",
                f"{mount_point}/{m.python}", *INTERPRETER_FLAGS]

    def launch_env(self, mount_point: str = DEFAULT_MOUNT_POINT) -> dict[str, str]:
        """Environment for interpreters started without -I (older tools and tests); the agent's own
        start needs none (`agent_launcher`)."""
        return {"PYTHONHOME": f"{mount_point}/{self.manifest.home}", "PYTHONPATH": mount_point}

    @property
    def hash_file(self) -> Path:
        return self.path.with_name(self.path.name + CONTENT_HASH_SUFFIX)

    def verify_content(self) -> None:
        """Raise BackendError unless the bundle's files hash to what was recorded beside it when it was
        built: the agent zygote runs them as root on the host, and a bundle changed since (a sandbox that
        got write access to it, a stray edit) must never get there."""
        deadline = time.monotonic() + HASH_FILE_WAIT_S
        while True:
            try:
                expected = self.hash_file.read_text().strip()
                break
            except FileNotFoundError as e:
                if time.monotonic() < deadline:  # its builder writes it right after publishing the bundle
                    time.sleep(0.05)
                    continue
                raise BackendError(f"the agent bundle {self.path} has no recorded content hash ({e}); "
                                   "remove the bundle directory so that it is built again") from e
        actual = content_hash(self.path)
        if actual != expected:
            raise BackendError(f"the agent bundle {self.path} was changed after it was built (its files hash "
                               f"to {actual[:16]}, recorded {expected[:16]}); refusing to run it as root. "
                               "Remove the bundle directory (it is rebuilt) and find what wrote to it")


_memo_lock = threading.Lock()
_memo: dict[tuple[Path, Path], AgentBundle] = {}


def default_cache_dir() -> Path:
    return resolve_home() / "cache"


def ensure_agent_bundle(cache_dir: Path | None = None, agent_dir: Path = AGENT_SOURCE_DIR) -> AgentBundle:
    """Return the bundle for the current agent sources and interpreter, building it if needed."""
    cache_dir = Path(cache_dir or default_cache_dir())
    with _memo_lock:
        memo_key = (cache_dir, agent_dir)
        if memo_key in _memo and _memo[memo_key].path.is_dir():
            return _memo[memo_key]
        key = bundle_key(agent_dir)
        final = cache_dir / f"agent-bundle-{key}"
        if not (final / "manifest.json").is_file():
            _build(final, key, agent_dir)
        manifest = BundleManifest.model_validate_json((final / "manifest.json").read_text())
        bundle = AgentBundle(path=final, manifest=manifest)
        _memo[memo_key] = bundle
        return bundle


def bundle_key(agent_dir: Path = AGENT_SOURCE_DIR) -> str:
    """Hash of everything a bundle is made from: agent sources, the interpreter binary, the format."""
    if not (agent_dir / "__main__.py").is_file():
        raise BackendError(f"the sandbox agent package is missing or incomplete at {agent_dir} "
                           "(no __main__.py); reinstall orchard")
    h = hashlib.sha256(f"format={BUNDLE_FORMAT}\n{sys.version}\n".encode())
    exe = Path(os.path.realpath(sys.executable))
    st = exe.stat()
    h.update(f"{exe}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for f in sorted(_agent_sources(agent_dir)):
        h.update(f"{f.relative_to(agent_dir)}\n".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def content_hash(root: Path) -> str:
    """sha256 over every entry of the bundle but its manifest: relative path, kind, the executable bit,
    and the file's bytes or the link's target; so an added, removed or changed file changes it."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            relative = os.path.relpath(path, root)
            if relative == "manifest.json":
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                h.update(b"L %s -> %s\0" % (os.fsencode(relative), os.fsencode(os.readlink(path))))
            elif stat.S_ISDIR(st.st_mode):
                h.update(b"D %s\0" % os.fsencode(relative))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
                        else hashlib.sha256(f.read()).hexdigest()
                h.update(b"F %s %d %s\0" % (os.fsencode(relative), bool(st.st_mode & 0o111), digest.encode()))
            else:
                h.update(b"? %s\0" % os.fsencode(relative))
    return h.hexdigest()


def _agent_sources(agent_dir: Path) -> list[Path]:
    return [p for p in agent_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and p.suffix not in (".pyc", ".pyo")]


def _build(final: Path, key: str, agent_dir: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        loader = _build_into(tmp, key, agent_dir)
        digest = content_hash(tmp)
        manifest = BundleManifest(key=key, python_version=sys.version.split()[0],
                                  loader=f"runtime/lib/{loader}", content_hash=digest)
        (tmp / "manifest.json").write_text(manifest.model_dump_json(indent=2))
        tmp.chmod(0o755)
        hash_file = final.with_name(final.name + CONTENT_HASH_SUFFIX)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another builder published the same key first; theirs is identical, keep it (and its hash).
            if not (final / "manifest.json").is_file():
                raise
        else:  # ours is published: record its hash (atomically; a reader before this finds none and says so)
            hash_tmp = hash_file.with_name(f".{hash_file.name}.{os.getpid()}")
            hash_tmp.write_text(digest + "\n")
            os.rename(hash_tmp, hash_file)
    except (OSError, subprocess.SubprocessError) as e:
        raise BackendError(f"could not build the agent bundle in {final.parent}: {e}; check that the "
                           "directory is writable and has ~50 MB free") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_abandoned_builds(cache_dir: Path, older_than_s: float = 3600) -> None:
    """Temp dirs of builders that were killed mid-build (a live build takes seconds, not an hour)."""
    for tmp in cache_dir.glob(".agent-bundle-*"):
        try:
            if time.time() - tmp.stat().st_mtime > older_than_s:
                shutil.rmtree(tmp, ignore_errors=True)
        except FileNotFoundError:
            pass


def _build_into(root: Path, key: str, agent_dir: Path) -> str:
    """Fill `root` with the bundle; returns the loader's file name."""
    runtime = root / "runtime"
    libdir = runtime / "lib"
    (runtime / "bin").mkdir(parents=True)
    (root / "run").mkdir()
    (root / "harness").mkdir()
    exe = Path(os.path.realpath(sys.executable))
    shutil.copy2(exe, runtime / "bin" / "python3")

    stdlib = Path(sysconfig.get_path("stdlib"))
    dynload = Path(sysconfig.get_config_var("DESTSHARED") or stdlib / "lib-dynload")
    stdlib_dest = libdir / f"python{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copytree(stdlib, stdlib_dest, ignore=_ignore_stdlib, symlinks=False)
    dynload_dest = stdlib_dest / "lib-dynload"
    if dynload.resolve() != (stdlib / "lib-dynload").resolve():
        shutil.copytree(dynload, dynload_dest, ignore=_ignore_stdlib, dirs_exist_ok=True)
    extensions = [p for p in dynload_dest.iterdir() if p.suffix == ".so"]

    loader_name = copy_native_libraries([exe, *extensions], libdir)

    _strip_debug_info([runtime / "bin" / "python3", *libdir.glob("*.so*"), *extensions])

    shutil.copytree(agent_dir, root / AGENT_PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo"))
    # Sandboxes mount the bundle read-only: ship bytecode so no start recompiles anything.
    if not compileall.compile_dir(root, quiet=2, workers=1):
        raise BackendError("byte-compiling the agent bundle failed; the agent sources have a syntax error")
    return loader_name


def copy_native_libraries(binaries: list[Path], libdir: Path) -> str:
    """Copy into `libdir` every shared library `ldd` resolves for `binaries` and the dynamic loader the
    first one names, so they run anywhere through that loader with `--library-path libdir`; returns the
    loader's file name."""
    libraries: dict[str, Path] = {}
    for binary in binaries:
        libraries.update(_shared_libraries(binary))
    interpreter = _elf_interpreter(binaries[0])
    loader = Path(interpreter).name
    libraries[loader] = Path(os.path.realpath(interpreter))
    for name, source in libraries.items():
        shutil.copyfile(source, libdir / name)
        (libdir / name).chmod(0o755)
    return loader


def _strip_debug_info(binaries: list[Path]) -> None:
    """Drop debug sections (pyenv builds keep them: libpython shrinks ~5x). Optional: without binutils
    the bundle is just bigger."""
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, "--strip-debug", *map(str, binaries)], capture_output=True, check=False)


def _ignore_stdlib(directory: str, names: list[str]) -> set[str]:
    ignored = set()
    for n in names:
        path = os.path.join(directory, n)
        if n in PRUNED_STDLIB_DIRS and os.path.isdir(path):
            ignored.add(n)
        elif n.startswith(PRUNED_STDLIB_PREFIXES) and os.path.isdir(path):
            ignored.add(n)
        elif ".opt-" in n and n.endswith(".pyc"):
            ignored.add(n)
        elif n.endswith(".so") and n.startswith(PRUNED_EXTENSION_PREFIXES):
            ignored.add(n)
    return ignored


def _shared_libraries(binary: Path) -> dict[str, Path]:
    """soname -> real file for every library `ldd` resolves for `binary` (the loader excluded)."""
    try:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError as e:
        raise BackendError("`ldd` is needed to build the agent bundle; install libc-bin") from e
    libs: dict[str, Path] = {}
    for line in out.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if not arrow or name.startswith(VIRTUAL_LIBRARIES):
            continue
        target = rest.split(" (")[0].strip()
        if target == "not found":
            raise BackendError(f"{binary} needs {name}, which ldd cannot find; the interpreter's "
                               "installation is broken")
        libs[name] = Path(os.path.realpath(target))
    return libs


def _elf_interpreter(binary: Path) -> str:
    """The dynamic loader named by the ELF PT_INTERP header (64-bit little-endian ELF only)."""
    with open(binary, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise BackendError(f"{binary} is not a 64-bit little-endian ELF; the bundled runtime "
                               "supports such Linux interpreters only")
        phoff, = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
            if p_type == 3:  # PT_INTERP
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\x00").decode()
    raise BackendError(f"{binary} is statically linked (no PT_INTERP); use a dynamically linked "
                       "interpreter to build the agent bundle")
