"""The agent bundle: a self-contained Python runtime plus the agent, built once and shared read-only.

Real builds (ldd, the interpreter's files, byte-compiling) into pytest temp dirs; the Python-less rootfs
case is exercised on real sandboxes in test_local_backend.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.core.errors import BackendError
from orchard.sandbox.bundle import CONTENT_HASH_SUFFIX, bundle_key, ensure_agent_bundle


@pytest.fixture(scope="module")
def bundle_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bundle-cache")

def test_bundle_is_self_contained_and_pruned(bundle_cache):
    bundle = ensure_agent_bundle(bundle_cache)
    root, m = bundle.path, bundle.manifest
    lib = root / m.library_dir
    assert (root / m.loader).is_file() and (lib / "libc.so.6").is_file()
    assert (root / m.python).is_file() and (root / "orchard_agent" / "__main__.py").is_file()
    stdlib = lib / f"python{m.python_version.rsplit('.', 1)[0]}"
    assert (stdlib / "lib-dynload").is_dir() and (stdlib / "json").is_dir()
    for pruned in ("test", "idlelib", "tkinter", "ensurepip", "lib2to3", "site-packages", "turtledemo"):
        assert not (stdlib / pruned).exists(), pruned
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert size < 80 << 20, f"bundle is {size >> 20} MiB"
    # Runs from wherever it is, with an empty environment, through its own loader.
    argv = bundle.launch_argv("unix:/unused", "/", mount_point=str(root))
    argv = argv[:argv.index("-c")] + ["-c", "import sys; print(sys.prefix)"]
    out = subprocess.run(argv, env=bundle.launch_env(mount_point=str(root)), capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == str(root / m.home)


def test_bundle_key_follows_the_agent_sources(tmp_path):
    agent = tmp_path / "agent"
    shutil.copytree(Path(__file__).resolve().parents[1] / "orchard" / "sandbox" / "agent", agent,
                    ignore=shutil.ignore_patterns("__pycache__"))
    first = bundle_key(agent)
    assert bundle_key(agent) == first
    (agent / "__main__.py").write_text((agent / "__main__.py").read_text() + "\n# changed\n")
    assert bundle_key(agent) != first
    (agent / "__main__.py").unlink()
    with pytest.raises(BackendError, match="agent package"):
        bundle_key(agent)


@pytest.mark.slow
def test_concurrent_builders_publish_one_complete_bundle(tmp_path):
    cache = tmp_path / "cache"
    code = ("import sys; from pathlib import Path; from orchard.sandbox.bundle import ensure_agent_bundle; "
            "print(ensure_agent_bundle(Path(sys.argv[1])).path)")
    builders = [subprocess.Popen([sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE, text=True)
                for _ in range(3)]
    paths = {b.communicate(timeout=120)[0].strip() for b in builders}
    assert all(b.returncode == 0 for b in builders)
    assert len(paths) == 1
    name = Path(paths.pop()).name
    # no half-built leftovers; the bundle's content hash beside it, matching the published bundle
    assert sorted(p.name for p in cache.iterdir()) == [name, name + CONTENT_HASH_SUFFIX]
    ensure_agent_bundle(cache).verify_content()
