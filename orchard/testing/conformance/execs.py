"""Exec semantics: output and exit codes, env and cwd, timeouts, reaping, output caps, streaming, shell sessions."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from orchard.sandbox.sync import SyncShellSession
from orchard.testing.conformance._rig import CALL_TIMEOUT_S, ConformanceRig, process_state, wait_until


class ExecChecks(ConformanceRig):
    def test_exec_reports_stdout_stderr_and_the_exit_code(self, sandbox):
        r = sandbox.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
        assert not r.stdout_truncated and not r.stderr_truncated
        argv = sandbox.exec(["echo", "argv", "$NOT_EXPANDED"])
        assert argv.ok and argv.stdout == "argv $NOT_EXPANDED\n"
        assert sandbox.exec(["definitely-not-a-program-orchard"]).exit_code == 127

    def test_exec_env_cwd_and_stdin(self, shared):
        info, sandbox = shared
        assert sandbox.exec("pwd").stdout == info.spec.workdir + "\n"
        assert sandbox.exec("pwd", cwd="/").stdout == "/\n"
        r = sandbox.exec("echo $ORCHARD_CONFORMANCE $EXTRA", env={"EXTRA": "per-command"})
        assert r.stdout == "spec-env per-command\n"
        data = "line\n" * 20000  # more than a pipe buffer
        assert sandbox.exec("cat", stdin=data).stdout == data

    def test_exec_timeout_kills_the_command_and_its_children(self, sandbox):
        r = sandbox.exec("sleep 300 & echo $!; sleep 300", timeout=1)
        assert r.timed_out and r.exit_code is None
        child = r.stdout.split()[0]
        wait_until(lambda: process_state(sandbox, child) in ("", "Z"),
                   f"the timed-out command's child {child} to be killed")

    def test_processes_left_behind_are_reaped_when_they_end(self, sandbox):
        """A command's background process outlives it, ends, and must not stay a zombie: zombies fill the
        process table (and count against max_processes) until the sandbox can start nothing."""
        r = sandbox.exec("sleep 0.2 >/dev/null 2>&1 & echo $!")
        orphan = r.stdout.split()[0]
        wait_until(lambda: process_state(sandbox, orphan) == "",
                   f"process {orphan}, which ended after its parent, to be reaped (it stays a zombie when "
                   "the sandbox's init process does not reap orphans)", timeout=10)

    def test_exec_output_over_the_cap_is_truncated_and_reported(self, sandbox):
        r = sandbox.exec("head -c 100000 /dev/zero | tr '\\0' a; echo e >&2", max_output_bytes=1000)
        assert r.exit_code == 0 and r.stdout == "a" * 1000 and r.stdout_truncated
        assert r.stderr == "e\n" and not r.stderr_truncated

    def test_exec_stream_yields_output_in_order_then_the_result(self, sandbox):
        events = list(sandbox.exec_stream("echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three"))
        assert [(e.kind, e.data) for e in events[:-1]] == [("stdout", "one\n"), ("stderr", "two\n"),
                                                           ("stdout", "three\n")]
        assert events[-1].kind == "exit" and events[-1].result.exit_code == 0
        timed = list(sandbox.exec_stream("echo started; sleep 300", timeout=1))
        assert timed[0].data == "started\n" and timed[-1].result.timed_out

    @pytest.fixture
    def session(self, sandbox) -> Iterator[SyncShellSession]:
        session = sandbox.shell(f"conformance-{secrets.token_hex(3)}")
        assert session.run("cd / && export KEPT=42").exit_code == 0
        yield session
        session.close()

    def test_a_shell_session_keeps_its_directory_and_exports(self, session):
        r = session.run("pwd; echo $KEPT; false")
        assert r.output == "/\n42\n" and r.exit_code == 1
        assert session.run("echo $KEPT; pwd").output == "42\n/\n"

    def test_a_session_command_past_its_timeout_is_stopped_and_the_session_kept(self, session):
        timed = session.run("sleep 300; echo not-reached", timeout=1)
        assert timed.timed_out and timed.exit_code is None
        assert "not-reached" not in timed.output, f"the rest of the command line ran after the timeout: {timed}"
        assert session.run("echo $KEPT; pwd").output == "42\n/\n"

    def test_an_interrupted_session_command_is_stopped_and_the_session_kept(self, sandbox, session):
        marker = f"/tmp/conformance-interrupt-{secrets.token_hex(3)}"
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(session.run, f"touch {marker}; sleep 300; echo not-reached")
            wait_until(lambda: sandbox.exec(f"test -e {marker}").ok, "the session's command to start")
            session.interrupt()
            interrupted = pending.result(timeout=CALL_TIMEOUT_S)
        assert not interrupted.timed_out
        assert "not-reached" not in interrupted.output, f"the rest of the command line ran after the interrupt: " \
                                                          f"{interrupted}"
        assert interrupted.exit_code == 130, interrupted  # like Ctrl-C (docs/agent-protocol.md)
        assert session.run("echo $KEPT; pwd").output == "42\n/\n"
