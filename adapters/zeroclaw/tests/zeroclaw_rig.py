"""Shared pieces of the adapter's tests (the fixtures are in conftest.py). They use Orchard as a user of the
package does: its CLI, its documented Python API and its test kit (orchard.testing); nothing of Orchard's own
test tree.

- `build_cache(cache)`: a cache holding the `zeroclaw` harness bundle (Debian's Python, for the
  real binary's driver), built with `orchard harness build`; the .debs it downloads are kept between
  sessions in this machine's temp dir.
- `home_with_cache(directory, cache)`: an Orchard home whose cache is that one.
- `STANDIN`: the stand-in for the ZeroClaw binary (zeroclaw_standin.py: it is not ZeroClaw, which cannot be built
  here; it speaks ZeroClaw's gateway frames).
- `scripted_model(script, directory)`: Orchard's scripted model server playing a script; `write_suite`, `task`:
  a suite of small script-graded tasks; `trajectories`, `results`: what `orchard eval` wrote;
  `host_processes(marker)`: what still runs on this machine; `debian_home(home)`: the Debian image that
  Harbor's tasks name, imported into a home."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.core.trajectory import Trajectory

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "zeroclaw_standin.py"
ADAPTER = HERE.parent
REPOSITORY = ADAPTER.parents[1]


def orchard(*args: str, home: Path | None = None, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """The `orchard` command, as a user runs it."""
    environment = {**os.environ, "COLUMNS": "200", **(env or {})}
    if home is not None:
        environment["ORCHARD_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "orchard.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment, cwd=cwd)


def build_cache(cache: Path) -> Path:
    """`cache` with the `zeroclaw` bundle built in it (the .debs kept between sessions in the temp dir)."""
    downloads = Path(tempfile.gettempdir()) / f"orchard-zeroclaw-test-downloads-{os.getuid()}"
    downloads.mkdir(exist_ok=True)
    (cache / "harness-downloads").symlink_to(downloads, target_is_directory=True)
    built = orchard("harness", "build", "zeroclaw", "--cache-dir", str(cache))
    assert built.returncode == 0, built.stdout + built.stderr
    return cache


def home_with_cache(directory: Path, cache: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cache").symlink_to(cache, target_is_directory=True)
    return directory


@contextlib.contextmanager
def scripted_model(script: list[dict[str, Any]], directory: Path) -> Iterator[str]:
    """Orchard's scripted OpenAI-compatible server (orchard.testing.scripted_model) playing `script`; its base
    URL. A stand-in for the model only."""
    path = directory / "script.json"
    path.write_text(json.dumps(script))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "orchard.testing.scripted_model", "--script", str(path),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                if server.poll() is not None:
                    raise AssertionError(f"the scripted model server exited: {server.stderr.read().decode()}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(10)


def write_suite(directory: Path, tasks: list[dict[str, Any]]) -> Path:
    """An Orchard suite directory (tasks.jsonl) of `tasks` (Task objects as JSON)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return directory


def task(task_id: str, instruction: str, grader: str, **environment: Any) -> dict[str, Any]:
    return {"id": task_id, "instruction": instruction,
            "environment": {"image": "host", "workdir": "/workspace", **environment},
            "grader": {"kind": "script", "script": grader, "timeout_s": 60}}


def trajectories(out: Path) -> list[Trajectory]:
    return [Trajectory.model_validate_json(line) for line in (out / "trajectories.jsonl").read_text().splitlines()
            if line.strip()]


def results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def host_processes(marker: str) -> list[str]:
    """Command lines of this machine's processes that contain `marker` (the local backend's sandboxes run here)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid():
            found.append(cmdline.strip())
    return found


DEBIAN_ARCHIVE = "localhost_orchard-debian_bookworm.oci.tar"


def debian_home(home: Path) -> Path:
    """`home` with the project's Debian image (what Harbor's tasks name), imported with `orchard image import`;
    without its archive (scripts/docker/daemon.sh image) the test skips, or fails with ORCHARD_DEBIAN=1."""
    archive = Path(os.environ.get("ORCHARD_DOCKER_DIR") or Path.home() / ".orchard" / "docker") / "cache" / \
        "images" / DEBIAN_ARCHIVE
    if not archive.is_file():
        reason = f"no Debian image archive at {archive}; build it with `scripts/docker/daemon.sh image`"
        if os.environ.get("ORCHARD_DEBIAN") == "1":
            pytest.fail(f"ORCHARD_DEBIAN=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    for name in ("debian:bookworm", "debian:bookworm-slim"):
        imported = orchard("image", "import", str(archive), "--name", name, home=home)
        assert imported.returncode == 0, imported.stdout + imported.stderr
    return home
