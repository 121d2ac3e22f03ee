"""docs/docker.md: every code block is checked (markers as in tests/doc_blocks.py). `daemon` lines name
subcommands scripts/docker/daemon.sh has, and its `env` prints the socket the backend defaults to; `cli`
lines parse; the `run` block runs on the real daemon and prints what its comment says."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import subprocess

import pytest

from tests import doc_blocks
from tests.docker_daemon import DAEMON_SCRIPT, TEST_IMAGE, require_daemon

DOC = doc_blocks.ROOT / "docs" / "docker.md"


def test_every_block_has_a_known_check():
    assert {kind for kind, *_ in doc_blocks.blocks(DOC)} == {"daemon", "cli", "run"}


def _daemon_usage() -> str:
    result = subprocess.run(["bash", str(DAEMON_SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_daemon_lines_name_subcommands_the_script_has():
    subcommands = {line.split()[0] for line in _daemon_usage().splitlines()[1:] if line.startswith("  ")}
    for _, code, line in doc_blocks.of_kind(DOC, "daemon"):
        for text in code.splitlines():
            words = shlex.split(text, comments=True)
            if words[:1] == ["eval"]:  # eval "$(bash scripts/docker/daemon.sh env)"
                words = shlex.split(words[1].removeprefix("$(").removesuffix(")"))
            assert words[:2] == ["bash", "scripts/docker/daemon.sh"], f"{DOC.name}:{line}: {text!r}"
            assert words[2] in subcommands, f"{DOC.name}:{line}: {words[2]!r} is not a daemon.sh subcommand"


def test_daemon_env_exports_the_socket_the_backend_defaults_to(tmp_path):
    from orchard.sandbox.backends.docker.config import daemon_script_socket
    environ = {**os.environ, "ORCHARD_DOCKER_DIR": str(tmp_path / "docker")}
    out = subprocess.run(["bash", str(DAEMON_SCRIPT), "env"], capture_output=True, text=True, timeout=30,
                         env=environ).stdout
    assert out == f"export DOCKER_HOST=unix://{daemon_script_socket(environ)}\n"


def test_cli_lines_name_real_commands_and_options():
    doc_blocks.check_cli_lines(DOC)


@pytest.mark.docker
def test_the_python_example_runs_on_the_daemon(tmp_path, monkeypatch):
    require_daemon()
    (_, code, line), = doc_blocks.of_kind(DOC, "run")
    assert TEST_IMAGE in code or os.environ.get("ORCHARD_DOCKER_TEST_IMAGE")
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))  # the embedded orchestrator's state
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace("localhost/orchard-debian:bookworm", TEST_IMAGE), f"{DOC.name}:{line}", "exec",
                     dont_inherit=True), {})
    assert printed.getvalue() == "42\n"
