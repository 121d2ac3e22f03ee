"""Attacks on the local backend's agent start through an imported image's environment and the agent bundle.

The chain of issue 21: an OCI image whose config sets `LD_PRELOAD` ran its library inside the agent's
start (zygote off), where it remounted /.orchard writable and appended code to the agent bundle in the
host's cache; the next root orchestrator's zygote then ran that code as host root. Each link is tested
here on real parts (an image built offline and imported, real sandboxes, the real zygote):
  - the image's (and the spec's) loader and interpreter variables never reach the agent's own process,
    only its commands;
  - nothing inside a sandbox, even with every capability of its user namespace, can make the bundle
    writable;
  - the zygote refuses a bundle whose files differ from those it was built with."""

from __future__ import annotations

import ctypes
import json
import os
import py_compile
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from orchard.core.errors import BackendError
from orchard.core.sandbox import SandboxSpec, reserved_env_reason
from orchard.sandbox.agent_client import AgentSandbox
from orchard.sandbox.backends.local.bwrap import image_ids
from orchard.sandbox.backends.local import LocalBackend
from orchard.sandbox.bundle import AGENT_SOURCE_DIR, ensure_agent_bundle
from orchard.sandbox.images import ImageStore
from orchard.testing.oci_layout import Entry, write_oci_layout
from tests.local_backend_rig import busybox_layer, local_backend

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the zygote and the id-mapped sandbox need root")

# A library that, loaded into a process, leaves a marker naming that process and, in the agent (its
# executable is the bundle's loader under /.orchard), does what the attack did: remount the bundle
# writable and append code to the agent package.
EVIL_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    char exe[512] = {0}, path[64];
    readlink("/proc/self/exe", exe, sizeof exe - 1);
    snprintf(path, sizeof path, "/tmp/preloaded-%d", getpid());
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, "%s\n", exe); fclose(f); }
    if (strstr(exe, "/.orchard/")) {
        mount(NULL, "/.orchard", NULL, MS_REMOUNT | MS_BIND, NULL);
        int fd = open("/.orchard/orchard_agent/__init__.py", O_WRONLY | O_APPEND);
        if (fd >= 0) { write(fd, "\nPOISONED = 1\n", 14); close(fd); }
    }
}
"""
# A module that marks that it ran, then runs the real module's source in its place (so that the agent
# would go on working: the hijack is silent).
HIJACK = ("import os as _os\nopen('/tmp/hijacked-%s-' + str(_os.getpid()), 'w').close()\n"
          "exec(compile(open(__file__).read(), __file__, 'exec'))\n")
SHADOWED = ("json", "socket", "selectors", "threading", "tempfile", "tarfile", "shutil", "signal", "select",
            "subprocess", "argparse", "traceback", "http", "email", "base64", "hashlib", "struct", "fcntl")
PYTHON_VERSION_TAG = "cpython-%d%d" % tuple(__import__("sys").version_info[:2])

# Every variable the dynamic loader (glibc's ld.so(8)) reads, with a value that would show if it were read.
LOADER_VARS = {
    "LD_PRELOAD": "/evil.so", "LD_AUDIT": "/evil.so", "LD_LIBRARY_PATH": "/evil-lib",
    "LD_DEBUG": "all", "LD_DEBUG_OUTPUT": "/tmp/ld-debug", "LD_PROFILE": "libc.so.6",
    "LD_PROFILE_OUTPUT": "/tmp/ld-profile", "LD_TRACE_LOADED_OBJECTS": "1", "LD_TRACE_PRELINKING": "1",
    "LD_SHOW_AUXV": "1", "LD_VERBOSE": "1", "LD_WARN": "1", "LD_BIND_NOW": "1", "LD_BIND_NOT": "1",
    "LD_DYNAMIC_WEAK": "1", "LD_HWCAP_MASK": "0", "LD_ORIGIN_PATH": "/evil-lib", "LD_POINTER_GUARD": "0",
    "LD_PREFER_MAP_32BIT_EXEC": "1", "LD_USE_LOAD_BIAS": "1", "LD_ASSUME_KERNEL": "2.2.5",
    "LD_LIBRARY_VERSION": "1", "LD_ELF_HINTS_PATH": "/evil-lib", "GLIBC_TUNABLES": "glibc.malloc.check=3",
}
# Every variable CPython (up to 3.13) reads, likewise; `_python_vars` adds any the interpreter names.
PYTHON_VARS = {
    "PYTHONHOME": "/evil-home", "PYTHONPATH": "/evil-py", "PYTHONPYCACHEPREFIX": "/pyc",
    "PYTHONSTARTUP": "/evil-py/startup.py", "PYTHONUSERBASE": "/evil-py", "PYTHONPLATLIBDIR": "evil",
    "PYTHONEXECUTABLE": "/evil", "PYTHONVERBOSE": "1", "PYTHONPROFILEIMPORTTIME": "1", "PYTHONDEBUG": "1",
    "PYTHONINSPECT": "1", "PYTHONOPTIMIZE": "2", "PYTHONWARNINGS": "error", "PYTHONDEVMODE": "1",
    "PYTHONMALLOC": "debug", "PYTHONMALLOCSTATS": "1", "PYTHONFAULTHANDLER": "1", "PYTHONTRACEMALLOC": "5",
    "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0", "PYTHONHASHSEED": "0", "PYTHONINTMAXSTRDIGITS": "640",
    "PYTHONSAFEPATH": "0", "PYTHONNOUSERSITE": "0", "PYTHONCASEOK": "1", "PYTHONBREAKPOINT": "evil.hook",
    "PYTHONCOERCECLOCALE": "0", "PYTHONDONTWRITEBYTECODE": "0", "PYTHONUNBUFFERED": "1",
    "PYTHONNODEBUGRANGES": "1", "PYTHONWARNDEFAULTENCODING": "1", "PYTHONASYNCIODEBUG": "1",
    "PYTHONTHREADDEBUG": "1", "PYTHONDUMPREFS": "1", "PYTHONLEGACYWINDOWSFSENCODING": "1",
    "PYTHONLEGACYWINDOWSSTDIO": "1", "PYTHONPERFSUPPORT": "1", "PYTHON_CPU_COUNT": "1",
    "PYTHON_FROZEN_MODULES": "off", "PYTHON_GIL": "0", "PYTHON_COLORS": "1", "PYTHON_BASIC_REPL": "1",
    "PYTHON_HISTORY": "/tmp/evil-history", "PYTHON_PERF_JIT_SUPPORT": "1", "PYTHON_JIT": "1",
}
# What an interpreter that read them would write into its stderr (the sandbox's agent.log).
INTERPRETER_NOISE = ("import time:", "# installing zipimport hook", "Small block threshold", "ld.so",
                     "AT_", "cannot be preloaded", "Traceback")


def _python_vars(bundle) -> dict[str, str]:
    """PYTHON_VARS, plus any variable the bundled interpreter's --help-env names that it lacks (set to 1)."""
    out = subprocess.run([*bundle.interpreter_argv(str(bundle.path)), "--help-env"], capture_output=True,
                         text=True).stdout
    named = {word.rstrip(":") for line in out.splitlines() for word in line.split()[:1]
             if word.startswith("PYTHON") and word.rstrip(":").replace("_", "").isalnum()}
    return {**{name: "1" for name in named}, **PYTHON_VARS}


def _evil_library(tmp_path: Path) -> bytes:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.fail("a C compiler (gcc) is needed to build the preloaded library: run scripts/setup-system.sh")
    source = tmp_path / "evil.c"
    source.write_text(EVIL_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "evil.so"), str(source)], check=True)
    return (tmp_path / "evil.so").read_bytes()


def _hijacking_pyc(tmp_path: Path, name: str) -> bytes:
    """A .pyc the interpreter takes without looking at the source (unchecked hash-based)."""
    source = tmp_path / "hijack.py"
    source.write_text(HIJACK % name)
    pyc = py_compile.compile(str(source), cfile=str(tmp_path / "hijack.pyc"),
                             invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return Path(pyc).read_bytes()


def _evil_image(tmp_path: Path, store: ImageStore, env: dict[str, str]) -> str:
    """An image of a static busybox plus everything the variables point at: the preloaded library (also as
    a libm in LD_LIBRARY_PATH), modules shadowing the standard library's on PYTHONPATH, and hijacking
    .pyc files for every agent module under PYTHONPYCACHEPREFIX; its config sets `env`."""
    evil = _evil_library(tmp_path)
    layer = [*busybox_layer(("sh", "env", "cat", "ls", "echo")),
             Entry.dir("tmp", mode=0o1777), Entry.file("evil.so", evil, mode=0o755),
             Entry.dir("evil-lib"), Entry.file("evil-lib/libm.so.6", evil, mode=0o755),
             Entry.dir("evil-py"), Entry.file("evil-py/startup.py", b"open('/tmp/hijacked-startup', 'w')\n"),
             Entry.dir("pyc"), Entry.dir("pyc/.orchard"), Entry.dir("pyc/.orchard/orchard_agent")]
    layer += [Entry.file(f"evil-py/{name}.py", (f"open('/tmp/hijacked-{name}', 'w').close()\n"
                                               f"raise ImportError('shadowed {name}')\n").encode())
              for name in SHADOWED]
    pyc = _hijacking_pyc(tmp_path, "agent")
    layer += [Entry.file(f"pyc/.orchard/orchard_agent/{module.stem}.{PYTHON_VERSION_TAG}.pyc", pyc)
              for module in AGENT_SOURCE_DIR.glob("*.py")]
    name = f"localhost/evil-{secrets.token_hex(3)}:1"
    write_oci_layout(tmp_path / "layout", [layer], name=name, env=[f"{k}={v}" for k, v in env.items()])
    store.import_archive(tmp_path / "layout", ids=image_ids())
    return name


@pytest.fixture
def private_cache(bundle_cache):
    """A copy of the session's bundle cache: an attack that got through would change only this one. Under
    /var/tmp, which sandboxes of the host image see (bound from the host, with the cache hidden under a
    tmpfs), unlike /tmp (theirs is their own)."""
    top = Path(tempfile.mkdtemp(prefix="orchard-test-cache-", dir="/var/tmp"))
    try:
        shutil.copytree(bundle_cache, top / "cache", symlinks=True)
        yield top / "cache"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _agent_pid(init_pid: int) -> int:
    """The agent: the only child of the sandbox's init (bwrap's, or the zygote's agent adopted by it)."""
    with open(f"/proc/{init_pid}/task/{init_pid}/children") as f:
        children = [int(pid) for pid in f.read().split()]
    assert len(children) == 1, children
    return children[0]


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        entries = [e.decode(errors="replace") for e in f.read().split(b"\0") if e]
    return dict(e.split("=", 1) for e in entries if "=" in e)


def _mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    return {p for p in paths if p.startswith("/")}


async def _create(backend: LocalBackend, spec: SandboxSpec):
    sandbox_id, token = f"e{secrets.token_hex(4)}", secrets.token_hex(16)
    made = await backend.create(sandbox_id, spec, token)
    return made, AgentSandbox(sandbox_id, made.agent_url, token)


@needs_root
async def test_an_image_ld_preload_never_reaches_the_agent_nor_the_next_zygote(tmp_path, private_cache):
    """The attack as reported: an imported image sets LD_PRELOAD to its library, which (run in the agent's
    start) would remount the bundle writable and append code to it; a sandbox is made with the zygote
    off, then a root backend with the zygote on is started on the same home. The library never runs in
    the agent (no marker; the agent's environment has no LD_PRELOAD), the workload gets the variable, the
    bundle is unchanged and the zygote starts agents from it."""
    store = ImageStore(tmp_path / "images")
    image = _evil_image(tmp_path, store, {"PATH": "/bin", "LD_PRELOAD": "/evil.so"})
    bundle = ensure_agent_bundle(private_cache)
    original = (bundle.path / "orchard_agent" / "__init__.py").read_bytes()
    for zygote in (False, True):
        async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=private_cache, image_dir=store.root,
                                 zygote=zygote) as backend:
            made, sandbox = await _create(backend, SandboxSpec(image=image))
            async with sandbox as sb:
                assert "LD_PRELOAD" not in _environ(_agent_pid(made.handle["init_pid"]))
                seen = await sb.exec("echo $LD_PRELOAD; ls /tmp")
                assert seen.stdout == "/evil.so\n", seen  # the workload's (busybox is static: no marker)
            await backend.delete(made)
        assert (bundle.path / "orchard_agent" / "__init__.py").read_bytes() == original
        bundle.verify_content()


@needs_root
@pytest.mark.parametrize("zygote", [False, True], ids=["zygote-off", "zygote-on"])
async def test_loader_and_interpreter_variables_reach_only_the_workload(tmp_path, private_cache, zygote):
    """Every LD_* and PYTHON* variable (and GLIBC_TUNABLES) set by the image, and every one a spec may set
    (the spec refuses the four the agent reserves), each with a value that would show if the agent's
    loader or interpreter read it: the agent starts and serves, its own environment has none of them,
    it maps no file from outside the bundle, nothing it would have loaded ran (no marker, no import
    trace in its log), and the bundle is unchanged; its commands see every variable as set."""
    store = ImageStore(tmp_path / "images")
    bundle = ensure_agent_bundle(private_cache)
    variables = {**LOADER_VARS, **_python_vars(bundle)}
    image = _evil_image(tmp_path, store, variables)
    refused = {name for name in variables if reserved_env_reason(name)}
    assert refused == {"LD_PRELOAD", "LD_AUDIT", "PYTHONHOME", "PYTHONPATH"}
    for name in refused:
        with pytest.raises(ValueError, match="per command"):
            SandboxSpec(env={name: variables[name]})
    spec_env = {name: value + ":spec" if value.startswith("/") else value
                for name, value in variables.items() if name not in refused}
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=private_cache, image_dir=store.root,
                             zygote=zygote) as backend:
        for env in ({}, spec_env):
            made, sandbox = await _create(backend, SandboxSpec(image=image, env=env))
            async with sandbox as sb:
                agent = _agent_pid(made.handle["init_pid"])
                seen = await sb.exec("env")
                assert seen.exit_code == 0, seen
                commands_env = dict(line.split("=", 1) for line in seen.stdout.splitlines() if "=" in line)
                expected = {**variables, **env}
                assert {k: commands_env.get(k) for k in expected} == expected
                own = _environ(agent)
                leaked = sorted(k for k in own if k.startswith(("LD_", "PYTHON", "GLIBC_")))
                assert leaked == [], f"the agent's own environment has {leaked}"
                outside = sorted(p for p in _mapped_files(agent)
                                 if not p.startswith(("/.orchard/", str(bundle.path.resolve()) + "/")))
                assert outside == [], f"the agent maps files from outside its bundle: {outside}"
                marks = (await sb.exec("ls /tmp; cat /tmp/preloaded-* 2>/dev/null")).stdout.split()
                assert marks == [], f"something the variables name ran in the agent: {marks}"
                await sb.write_file("/tmp/probe", b"x")  # the agent still works
                assert (await sb.read_file("/tmp/probe")) == b"x"
            log = (Path(made.handle["sandbox_dir"]) / "agent.log").read_text(errors="replace")
            assert not [n for n in INTERPRETER_NOISE if n in log], log[-2000:]
            await backend.delete(made)
        bundle.verify_content()


def _inside(pid: int, attempt) -> dict:
    """Run `attempt()` in a child that has joined the user and mount namespaces of `pid` with every
    capability of that user namespace (more than the agent ever has: it keeps five, for its set-up),
    as the uid the agent starts as (host root, mapped into the sandbox); returns what it returned."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(read_end)
            libc = ctypes.CDLL(None, use_errno=True)
            for name in ("user", "mnt"):
                fd = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY)
                if libc.setns(fd, 0) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({name})")
                os.close(fd)
            os.chdir("/")
            result = attempt(libc)
            os.write(write_end, json.dumps(result).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(write_end, json.dumps({"error": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = json.loads(f.read() or b"{}")
    os.waitpid(child, 0)
    return answer


MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2


def _try_to_write(libc, directory: str, file: str, cover: str | None = None) -> dict:
    """What the attack did: remount `directory` writable (after taking off the tmpfs `cover` over it, when
    there is one) and append to `file`."""
    tried = {}
    if cover is not None:
        tried["umount cover"] = libc.umount2(cover.encode(), MNT_DETACH) == 0 or os.strerror(ctypes.get_errno())
    ok = libc.mount(None, directory.encode(), None, MS_REMOUNT | MS_BIND, None) == 0
    tried["remount rw"] = True if ok else os.strerror(ctypes.get_errno())
    try:
        with open(file, "a") as f:
            f.write("\nPOISONED = 1\n")
        tried["append"] = True
    except OSError as e:
        tried["append"] = e.strerror
    return tried


@needs_root
@pytest.mark.parametrize("image", ["oci", "host"])
async def test_nothing_in_a_sandbox_can_make_the_bundle_writable(tmp_path, private_cache, image):
    """From inside a sandbox (zygote off, as in the attack), with every capability of its user namespace
    and the agent's uid: remounting the bundle at /.orchard writable is refused and so is writing to it;
    on the host image, taking off the tmpfs that hides Orchard's cache and remounting the cache writable
    fails the same way (the host's directories are locked read-only there: local_launch.LOCK_SCRIPT)."""
    store = ImageStore(tmp_path / "images")
    name = _evil_image(tmp_path, store, {"PATH": "/bin"}) if image == "oci" else "host"
    bundle = ensure_agent_bundle(private_cache)
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=private_cache, image_dir=store.root,
                             zygote=False) as backend:
        made, sandbox = await _create(backend, SandboxSpec(image=name))
        async with sandbox as sb:
            init = made.handle["init_pid"]
            tried = _inside(init, lambda libc: _try_to_write(libc, "/.orchard", "/.orchard/orchard_agent/__init__.py"))
            assert tried == {"remount rw": "Operation not permitted", "append": "Read-only file system"}, tried
            if image == "host":
                cache = str(private_cache.resolve())
                tried = _inside(init, lambda libc: _try_to_write(
                    libc, cache, f"{bundle.path.resolve()}/orchard_agent/__init__.py", cover=cache))
                assert tried == {"umount cover": True, "remount rw": "Operation not permitted",
                                 "append": "Read-only file system"}, tried
            assert (await sb.exec("echo still-served")).stdout == "still-served\n"
        bundle.verify_content()  # not a byte changed
        await backend.delete(made)


@needs_root
async def test_the_zygote_refuses_a_changed_bundle(tmp_path, private_cache):
    """A bundle changed after it was built (here: code appended to the agent package, as the attack did)
    is refused before the zygote runs anything of it as root, with an error that says what to do; no
    zygote is left running and the sandbox is not made."""
    bundle = ensure_agent_bundle(private_cache)
    ran = tmp_path / "ran-as-root"
    with open(bundle.path / "orchard_agent" / "__init__.py", "a") as f:
        f.write(f"\nopen({str(ran)!r}, 'w')\n")
    async with local_backend(tmp_path / "sandboxes", bundle_cache_dir=private_cache, zygote=True) as backend:
        with pytest.raises(BackendError, match="changed after it was built.*refusing to run it as root.*Remove"):
            await backend.create("tampered", SandboxSpec(), secrets.token_hex(16))
        assert backend._zygote is None
        assert not (tmp_path / "sandboxes" / "tampered").exists()
        assert not ran.exists()
        bundle.hash_file.unlink()  # a missing record is refused too
        with pytest.raises(BackendError, match="no recorded content hash"):
            bundle.verify_content()
