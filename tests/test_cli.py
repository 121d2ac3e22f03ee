"""The `orchard` command against a real `orchard serve` subprocess and real sandboxes; the demo."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from tests.running_server import live_sandbox_ids, remove_live_sandboxes, running_server

runner = CliRunner()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # No --api-key: the server generates one and prints it; the fixture reads it from there.
    with running_server(tmp_path_factory.mktemp("cli-server-home")) as running:
        yield running


def orchard(*args: str, env: dict[str, str] | None = None):
    result = runner.invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def flat(text: str) -> str:
    """Rich wraps long lines to the terminal width; compare text with whitespace collapsed."""
    return " ".join(text.split())


@pytest.fixture
def cli_env(server) -> dict[str, str]:
    return {"ORCHARD_URL": server.url, "ORCHARD_API_KEY": server.api_key}


@pytest.fixture
def sandbox_id(cli_env) -> str:
    result = orchard("sandbox", "create", "--env", "FOO=bar", "--label", "suite=cli", env=cli_env)
    assert result.exit_code == 0, result.stderr
    yield result.stdout.strip()
    orchard("sandbox", "rm", result.stdout.strip(), env=cli_env)


@pytest.mark.parametrize("command", [[], ["serve"], ["sandbox"], ["sandbox", "create"], ["sandbox", "exec"],
                                     ["sandbox", "cp"], ["sandbox", "ls"], ["sandbox", "rm"]])
def test_every_command_has_help(command):
    result = orchard(*command, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.stdout and len(flat(result.stdout)) > 200


def test_serve_printed_a_generated_key_once(server):
    assert server.log.read_text().count("ORCHARD_API_KEY=") == 1


def test_sandbox_commands_without_a_server_explain_why_one_is_needed():
    result = orchard("sandbox", "ls", env={"ORCHARD_URL": "", "ORCHARD_API_KEY": ""})
    assert result.exit_code == 1
    message = flat(result.stderr)
    assert "error:" in message and "orchard serve" in message and "dies with the process" in message
    assert "Traceback" not in result.output


def test_create_exec_ls_rm(cli_env, sandbox_id):
    assert sandbox_id.startswith("sb-") and "\n" not in sandbox_id

    result = orchard("sandbox", "exec", sandbox_id, "--", "sh", "-c", "echo $FOO; echo oops >&2; exit 3",
                     env=cli_env)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "bar\n", "oops\n")
    result = orchard("sandbox", "exec", sandbox_id, "--", "echo piped | tr a-z A-Z", env=cli_env)
    assert (result.exit_code, result.stdout) == (0, "PIPED\n")
    result = orchard("sandbox", "exec", "--env", "X=1", "--cwd", "/tmp", sandbox_id, "--", "echo $X; pwd",
                     env=cli_env)
    assert result.stdout == "1\n/tmp\n"

    orchard("sandbox", "exec", sandbox_id, "--", "mkdir -p sub && echo hello > sub/greeting.txt", env=cli_env)
    listing = orchard("sandbox", "ls", f"{sandbox_id}:sub", env=cli_env)
    assert listing.exit_code == 0 and "greeting.txt" in listing.stdout
    assert "sub/" in orchard("sandbox", "ls", sandbox_id, env=cli_env).stdout

    table = orchard("sandbox", "ls", env=cli_env)
    assert table.exit_code == 0 and sandbox_id in table.stdout and "suite=cli" in table.stdout

    removed = orchard("sandbox", "rm", sandbox_id, env=cli_env)
    assert removed.exit_code == 0 and f"deleted {sandbox_id}" in removed.stdout
    after = orchard("sandbox", "exec", sandbox_id, "--", "true", env=cli_env)
    assert after.exit_code == 1 and "deleted" in flat(after.stderr)


def test_exec_timeout_exits_124(cli_env, sandbox_id):
    result = orchard("sandbox", "exec", "--timeout", "0.5", sandbox_id, "--", "sleep 30", env=cli_env)
    assert result.exit_code == 124 and "timeout" in flat(result.stderr)


def test_exec_through_the_real_entry_point_streams_and_propagates_the_exit_code(server, sandbox_id):
    command = [sys.executable, "-m", "orchard.cli.main", "sandbox", "exec", sandbox_id, "--",
               "echo out; echo err >&2; exit 42"]
    done = subprocess.run(command, env=server.env(), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (42, "out\n", "err\n")


def test_cp_a_directory_in_and_out(cli_env, sandbox_id, tmp_path):
    source = tmp_path / "project"
    (source / "pkg" / "deep").mkdir(parents=True)
    (source / "pkg" / "a.py").write_text("A = 1\n")
    (source / "pkg" / "deep" / "b.bin").write_bytes(bytes(range(256)) * 10)
    (source / "README").write_text("read me\n")

    up = orchard("sandbox", "cp", str(source), f"{sandbox_id}:/workspace/project", env=cli_env)
    assert up.exit_code == 0, up.stderr
    check = orchard("sandbox", "exec", sandbox_id, "--", "cat project/pkg/a.py; wc -c < project/pkg/deep/b.bin",
                    env=cli_env)
    assert check.stdout.split() == ["A", "=", "1", "2560"]

    orchard("sandbox", "exec", sandbox_id, "--", "echo new > project/made-inside", env=cli_env)
    down = orchard("sandbox", "cp", f"{sandbox_id}:project", str(tmp_path / "back"), env=cli_env)
    assert down.exit_code == 0, down.stderr
    back = tmp_path / "back"
    assert (back / "pkg" / "deep" / "b.bin").read_bytes() == (source / "pkg" / "deep" / "b.bin").read_bytes()
    assert (back / "README").read_text() == "read me\n" and (back / "made-inside").read_text() == "new\n"

    # A single file, into a directory (trailing slash) and back out under a chosen name.
    assert orchard("sandbox", "cp", str(source / "README"), f"{sandbox_id}:/tmp/", env=cli_env).exit_code == 0
    out = orchard("sandbox", "cp", f"{sandbox_id}:/tmp/README", str(tmp_path / "README.copy"), env=cli_env)
    assert out.exit_code == 0 and (tmp_path / "README.copy").read_text() == "read me\n"


def test_unknown_ids_and_bad_input_give_a_clear_message_and_non_zero_exit(cli_env, tmp_path):
    cases = [
        (["sandbox", "exec", "sb-unknown", "--", "true"], "sb-unknown"),
        (["sandbox", "ls", "sb-unknown:/"], "sb-unknown"),
        (["sandbox", "cp", "sb-unknown:/etc/hostname", str(tmp_path / "h")], "sb-unknown"),
        (["sandbox", "rm", "sb-unknown"], "sb-unknown"),
        (["sandbox", "cp", str(tmp_path), str(tmp_path / "x")], "exactly one of SRC and DST"),
        (["sandbox", "create", "--env", "NOVALUE"], "KEY=VALUE"),
        (["sandbox", "create", "--network", "sideways"], "--network"),
        (["sandbox", "create", "--cpu", "-1"], "cpu"),
        (["sandbox", "create", "--network", "open", "--allow", "example.org"], "allowlist"),
    ]
    for args, expected in cases:
        result = orchard(*args, env=cli_env)
        assert result.exit_code == 1, (args, result.stdout, result.stderr)
        assert "error:" in result.stderr and expected in flat(result.stderr), (args, result.stderr)
        assert "Traceback" not in result.output


def test_wrong_api_key_is_reported(server):
    result = orchard("sandbox", "ls", env={"ORCHARD_URL": server.url, "ORCHARD_API_KEY": "wrong"})
    assert result.exit_code == 1 and "API key" in flat(result.stderr)


@pytest.mark.slow
def test_demo_runs_and_leaves_nothing_behind(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_URL", "ORCHARD_API_KEY")}
    env.update(ORCHARD_HOME=str(tmp_path), COLUMNS="160")
    try:
        done = subprocess.run([sys.executable, "-m", "orchard.demo"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        for step in ("create sandbox", "shell session", "upload a directory", "download it back", "p50", "p99",
                     "state: deleted"):
            assert step in done.stdout, done.stdout
        assert asyncio.run(live_sandbox_ids(tmp_path)) == set()
    finally:
        remove_live_sandboxes(tmp_path)
