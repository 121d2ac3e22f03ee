"""`orchard serve` never takes its API key on the command line, where every user of the machine can read
it (`ps`, /proc/PID/cmdline): from ORCHARD_API_KEY or a file. Performed on real `orchard serve` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.security.serve_process import API_KEY, REPO_ROOT, Serve


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_key_on_the_command_line_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    result = subprocess.run([sys.executable, "-m", "orchard.cli.main", "serve", "--api-key", "visible-in-ps",
                             "--home", str(tmp_path)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result
    message = " ".join(result.stderr.split())
    assert "--api-key is not accepted" in message and "ORCHARD_API_KEY" in message and "--api-key-file" in message


def test_the_key_from_the_environment_is_not_on_the_command_line(tmp_path):
    server = Serve(tmp_path).wait_up()
    try:
        assert API_KEY not in cmdline(server.process.pid)
        def status(key: str) -> int:
            return httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": f"Bearer {key}"}).status_code

        assert status(API_KEY) == 200
        assert status("nope") == 401
    finally:
        server.stop()


def test_the_key_from_a_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("key-from-a-file\n")
    key_file.chmod(0o600)
    server = Serve(tmp_path, env={"ORCHARD_API_KEY": ""}, args=["--api-key-file", str(key_file)]).wait_up()
    try:
        assert "key-from-a-file" not in cmdline(server.process.pid)
        ok = httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": "Bearer key-from-a-file"})
        assert ok.status_code == 200, ok.text
        assert "ORCHARD_API_KEY=" not in server.log.read_text()  # nothing generated, nothing printed
    finally:
        server.stop()


def test_an_empty_key_file_is_an_error(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("\n")
    server = Serve(tmp_path, args=["--api-key-file", str(key_file)])
    assert server.process.wait(timeout=60) == 2
    assert "is empty" in server.log.read_text()


def test_the_sandbox_cli_warns_about_a_key_on_its_command_line(tmp_path):
    """`orchard sandbox ...` still accepts --api-key (scripts use it) but says loudly that ps shows it."""
    server = Serve(tmp_path).wait_up()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")}
    try:
        def sandbox_ls(extra_env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "orchard.cli.main", "sandbox", "ls", "--url", server.url,
                                   *args], cwd=REPO_ROOT, env={**env, **extra_env}, capture_output=True, text=True,
                                  timeout=60)

        flagged = sandbox_ls({}, "--api-key", API_KEY)
        assert flagged.returncode == 0, flagged.stderr
        assert "visible to every user" in " ".join(flagged.stderr.split())
        from_env = sandbox_ls({"ORCHARD_API_KEY": API_KEY})
        assert from_env.returncode == 0 and "visible" not in from_env.stderr, from_env.stderr
    finally:
        server.stop()
