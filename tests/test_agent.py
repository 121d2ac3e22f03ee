"""The in-sandbox agent, run for real as a subprocess (`python -m orchard.sandbox.agent`) and spoken to over
its Unix socket (and once over TCP) with httpx, exactly as docs/agent-protocol.md describes."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

AGENT_DIR = Path(__file__).resolve().parent.parent / "orchard" / "sandbox" / "agent"
# Set to another interpreter (e.g. a Python 3.8) to run every agent of this file under it, as the package
# `orchard_agent` the way sandboxes get it.
AGENT_PYTHON = os.environ.get("ORCHARD_TEST_AGENT_PYTHON")


class RunningAgent:
    """One agent process with its own token, socket and workdir; `stop()` removes all of it."""

    def __init__(self, listen: str = "unix", env: dict | None = None, argv=None, cwd=None, wrapper=()):
        """`wrapper`: a command the agent's runs under (e.g. `unshare ...`)."""
        # Unix socket paths are limited to 107 bytes: a short directory right under the temp dir.
        self.dir = tempfile.mkdtemp(prefix="oa-", dir=tempfile.gettempdir())
        self.workdir = os.path.join(self.dir, "work")
        self.token = secrets.token_hex(16)
        self.socket_path = os.path.join(self.dir, "agent.sock")
        address = "unix:" + self.socket_path if listen == "unix" else listen
        full_env = dict(os.environ, ORCHARD_AGENT_TOKEN=self.token, **(env or {}))
        if argv is None and AGENT_PYTHON:
            os.symlink(AGENT_DIR, os.path.join(self.dir, "orchard_agent"))
            full_env["PYTHONPATH"] = self.dir
            argv = [AGENT_PYTHON, "-m", "orchard_agent"]
        argv = argv or [sys.executable, "-m", "orchard.sandbox.agent"]
        self.proc = subprocess.Popen([*wrapper, *argv, "--listen", address, "--workdir", self.workdir], env=full_env,
                                     cwd=cwd, stdout=subprocess.PIPE)
        self.address = self._wait_ready()

    def _wait_ready(self) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(30):
                self.stop()
                raise RuntimeError("the agent did not print READY within 30 s")
        line = self.proc.stdout.readline().decode()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError("the agent printed %r instead of READY" % line)
        return line.split(None, 1)[1].strip()

    def client(self, token: str | None = None, **kwargs) -> httpx.Client:
        headers = {} if token == "" else {"Authorization": "Bearer " + (token or self.token)}
        if self.address.startswith("unix:"):
            return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket_path), base_url="http://agent",
                                headers=headers, timeout=60, **kwargs)
        return httpx.Client(base_url="http://" + self.address[len("tcp:"):], headers=headers, timeout=60,
                            **kwargs)

    def peak_rss_mb(self) -> float:
        for line in Path("/proc/%d/status" % self.proc.pid).read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM in /proc status")

    def __enter__(self) -> "RunningAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def agent():
    with RunningAgent() as running:
        yield running


@pytest.fixture(scope="module")
def client(agent):
    with agent.client() as c:
        yield c


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code
    assert body["message"]
    return body["message"]


# -- start-up, health, auth ------------------------------------------------------------------------------

def test_health_answers_without_a_token(agent):
    with agent.client(token="") as anonymous:
        body = anonymous.get("/health").json()
    assert body["status"] == "ok" and body["pid"] == agent.proc.pid and body["version"]


def test_stats_count_the_cpu_of_finished_commands_and_need_the_token():
    """/stats sums the processes of the agent's pid namespace. The agent runs in one of its own here, as in a
    sandbox: in the host's, the sum covered every process of the machine, and one ending elsewhere (reaped
    where the agent cannot see, its time lost) once moved it by -4.7 s during the measurement."""
    isolated = RunningAgent(wrapper=(shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--pid",
                                     "--fork", "--mount-proc", "--kill-child"))
    try:
        with isolated.client(token="") as anonymous:
            assert anonymous.get("/stats").status_code == 401
        with isolated.client() as client:
            before = client.get("/stats").json()
            burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
            assert client.post("/exec", json={"command": [sys.executable, "-c", burn]}).json()["exit_code"] == 0
            after = client.get("/stats").json()
        assert after["processes"] >= 1
        assert 0.25 <= after["cpu_seconds"] - before["cpu_seconds"] < 5  # the agent reaped it: its cutime
    finally:
        isolated.proc.kill()  # unshare waits out a SIGTERM; its death kills the agent (--kill-child)
        isolated.stop()


def test_missing_or_wrong_token_is_refused_and_tokens_are_per_agent(agent):
    other = RunningAgent()
    try:
        for token in ("", "wrong", other.token):
            with agent.client(token=token) as c:
                _error(c.post("/exec", json={"command": "true"}), 401, "unauthorized")
                _error(c.get("/files/stat", params={"path": "."}), 401, "unauthorized")
        with other.client() as c:
            assert c.post("/exec", json={"command": "true"}).json()["exit_code"] == 0
    finally:
        other.stop()


def test_agent_refuses_to_start_without_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_AGENT_TOKEN")}
    proc = subprocess.run([sys.executable, "-m", "orchard.sandbox.agent", "--listen", "tcp:127.0.0.1:0"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "ORCHARD_AGENT_TOKEN" in proc.stderr and proc.stdout == ""


def test_tcp_listener_reports_its_bound_port():
    tcp = RunningAgent(listen="tcp:127.0.0.1:0")
    try:
        host, port = tcp.address[len("tcp:"):].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        with tcp.client() as c:
            assert c.get("/health").json()["status"] == "ok"
            assert c.post("/exec", json={"command": "echo tcp"}).json()["stdout"] == "tcp\n"
    finally:
        tcp.stop()


def test_many_exec_and_session_round_trips_over_tcp():
    """Back-to-back requests on one TCP connection keep working (how fast they are is `make bench`'s
    exec_latency, which compares them with the floor in the same run)."""
    tcp = RunningAgent(listen="tcp:127.0.0.1:0")
    try:
        with tcp.client() as c:
            c.post("/sessions", json={"name": "fast"}).raise_for_status()
            for path, body in (("/exec", {"command": "true"}), ("/sessions/fast/run", {"command": "true"})):
                for _ in range(130):
                    response = c.post(path, json=body)
                    response.raise_for_status()
                    assert response.json()["exit_code"] == 0
    finally:
        tcp.stop()


def test_token_and_python_variables_are_scrubbed_from_children(agent, client):
    env_out = client.post("/exec", json={"command": "env"}).json()["stdout"]
    assert agent.token not in env_out
    assert "ORCHARD_AGENT_TOKEN" not in env_out and "PYTHONPATH=" not in env_out


def test_sigterm_removes_socket_and_kills_sessions():
    running = RunningAgent()
    try:
        with running.client() as c:
            c.post("/sessions", json={"name": "s"}).raise_for_status()
            shell_pid = int(c.post("/sessions/s/run", json={"command": "echo $$"}).json()["output"])
        running.proc.send_signal(signal.SIGTERM)
        assert running.proc.wait(10) == 0
        assert not os.path.exists(running.socket_path)
        assert not _alive(shell_pid)
    finally:
        running.stop()


# -- source constraints ----------------------------------------------------------------------------------

def test_agent_sources_parse_as_python_3_8():
    modules = sorted(AGENT_DIR.glob("*.py"))
    assert {"__init__.py", "__main__.py", "server.py", "execs.py", "sessions.py", "files.py"} <= {
        m.name for m in modules}
    for module in modules:
        source = module.read_text()
        tree = ast.parse(source, filename=str(module), feature_version=(3, 8))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(n.split(".")[0] in ("orchard", "httpx", "pydantic") for n in names), module
            if isinstance(node, ast.Attribute):  # 3.9+ only str methods
                assert node.attr not in ("removeprefix", "removesuffix"), module


def test_copied_package_runs_standalone_without_site_packages(tmp_path):
    """As in a sandbox: the package copied as `orchard_agent`, run with no site-packages (-S) at all."""
    shutil.copytree(AGENT_DIR, tmp_path / "orchard_agent", ignore=shutil.ignore_patterns("__pycache__"))
    copy = RunningAgent(argv=[sys.executable, "-S", "-m", "orchard_agent"], cwd=str(tmp_path))
    try:
        with copy.client() as c:
            assert c.post("/exec", json={"command": ["echo", "standalone"]}).json()["stdout"] == "standalone\n"
    finally:
        copy.stop()


# -- exec ------------------------------------------------------------------------------------------------

def test_exec_exit_code_stdout_stderr(client):
    r = client.post("/exec", json={"command": "echo out; echo err >&2; exit 3"}).json()
    assert (r["exit_code"], r["stdout"], r["stderr"], r["timed_out"]) == (3, "out\n", "err\n", False)
    assert r["stdout_truncated"] is False and r["duration_s"] >= 0


def test_exec_argv_cwd_env_stdin(agent, client):
    os.makedirs(os.path.join(agent.workdir, "sub"), exist_ok=True)
    assert client.post("/exec", json={"command": ["pwd"]}).json()["stdout"] == agent.workdir + "\n"
    assert client.post("/exec", json={"command": "pwd", "cwd": "sub"}).json()["stdout"] == \
        os.path.join(agent.workdir, "sub") + "\n"
    assert client.post("/exec", json={"command": "pwd", "cwd": "/"}).json()["stdout"] == "/\n"
    r = client.post("/exec", json={"command": "echo $FOO-$HOME", "env": {"FOO": "bar"}}).json()
    assert r["stdout"] == "bar-%s\n" % os.environ.get("HOME", "")
    data = "line one\nünïcode ✓\n" * 5000  # bigger than a pipe buffer
    assert client.post("/exec", json={"command": ["cat"], "stdin": data}).json()["stdout"] == data
    assert client.post("/exec", json={"command": "cat", "stdin": ""}).json()["stdout"] == ""


def test_exec_of_a_missing_program_reports_127(client):
    r = client.post("/exec", json={"command": ["definitely-not-a-program-xyz"]}).json()
    assert r["exit_code"] == 127 and "definitely-not-a-program-xyz" in r["stderr"]
    assert client.post("/exec", json={"command": "definitely-not-a-program-xyz"}).json()["exit_code"] == 127


def test_exec_timeout_kills_the_whole_process_group(client):
    # the request's own timeout, well under the sleeps, fails the test if the agent waited for them
    r = client.post("/exec", json={"command": "sh -c 'sleep 100 & echo $!; sleep 100'", "timeout": 1},
                    timeout=30).json()
    assert r["timed_out"] is True and r["exit_code"] is None
    grandchild = int(r["stdout"].split()[0])
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_exec_returns_when_command_exits_even_if_a_background_child_holds_the_pipes(agent, client):
    # The child left behind ends only once the test has the answer: had the agent waited for it, the
    # request would run into its own timeout.
    go = Path(agent.dir) / "child-go"
    r = client.post("/exec", json={"command": f"(while [ ! -e {go} ]; do sleep 0.05; done) & echo started"},
                    timeout=30).json()
    go.touch()
    assert r["exit_code"] == 0 and r["stdout"] == "started\n"
    # Even when what it left behind keeps writing (it then dies of SIGPIPE).
    go.unlink()
    r = client.post("/exec", json={"command": f"(while [ ! -e {go} ]; do echo x; sleep 0.01; done) & echo go"},
                    timeout=30)
    go.touch()
    assert r.json()["stdout"].startswith("go\n")


def test_exec_output_is_capped_and_the_rest_drained(client):
    r = client.post("/exec", json={"command": "head -c 5000000 /dev/zero | tr '\\0' a; echo e >&2",
                                   "max_output_bytes": 1000}).json()
    assert r["exit_code"] == 0 and r["stdout"] == "a" * 1000 and r["stdout_truncated"] is True
    assert r["stderr"] == "e\n" and r["stderr_truncated"] is False


def test_exec_reports_a_signal_death_like_a_shell(client):
    assert client.post("/exec", json={"command": "kill -9 $$"}).json()["exit_code"] == 137


def test_twenty_execs_run_in_parallel(agent):
    # A barrier: each exec marks its arrival and waits until all twenty have arrived, so they can only
    # finish if they run at the same time; run one after another, the first runs into its timeout.
    arrived = Path(agent.dir) / "arrived"
    arrived.mkdir()
    barrier = "touch %s/%%d; until [ $(ls %s | wc -l) -ge 20 ]; do sleep 0.05; done; echo %%d" % (arrived, arrived)
    with agent.client(limits=httpx.Limits(max_connections=20)) as c:
        def run(i):
            return c.post("/exec", json={"command": barrier % (i, i), "timeout": 60}).json()

        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(run, range(20)))
    assert not [r for r in results if r["timed_out"]], "the execs did not all run at the same time"
    assert [r["stdout"] for r in results] == ["%d\n" % i for i in range(20)]


def test_exec_stream_sends_events_in_order_as_they_happen(agent, client):
    # The command writes its next line only once the test has received the one before (a file each): were
    # output not streamed, it would wait until its timeout and never exit 0.
    step = os.path.join(agent.dir, "stream-step")
    wait = "until [ -e %s%%d ]; do sleep 0.02; done" % step
    body = {"command": "echo one; %s; echo two >&2; %s; echo three" % (wait % 1, wait % 2), "timeout": 60}
    events = []
    with client.stream("POST", "/exec/stream", json=body) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        for line in response.iter_lines():
            if line:
                events.append(json.loads(line))
                Path("%s%d" % (step, len(events))).touch()
    assert [(e["kind"], e["data"]) for e in events[:-1]] == [("stdout", "one\n"), ("stderr", "two\n"),
                                                             ("stdout", "three\n")]
    assert events[-1]["kind"] == "exit" and events[-1]["result"]["exit_code"] == 0
    assert events[-1]["result"]["stdout"] == ""


def test_exec_stream_timeout_and_cap(client):
    body = {"command": "head -c 3000 /dev/zero | tr '\\0' x; sleep 30", "timeout": 0.5,
            "max_output_bytes": 100}
    with client.stream("POST", "/exec/stream", json=body) as response:
        events = [json.loads(line) for line in response.iter_lines() if line]
    assert "".join(e["data"] for e in events if e["kind"] == "stdout") == "x" * 100
    result = events[-1]["result"]
    assert result["timed_out"] is True and result["exit_code"] is None and result["stdout_truncated"] is True


# -- sessions --------------------------------------------------------------------------------------------

def _run(client, name, command, **extra):
    response = client.post("/sessions/%s/run" % name, json=dict(command=command, **extra))
    assert response.status_code == 200, response.text
    return response.json()


def test_session_keeps_cwd_and_exports(agent, client):
    client.post("/sessions", json={"name": "state"}).raise_for_status()
    assert _run(client, "state", "cd /tmp && export MY_VAR=42 && local_var=7")["exit_code"] == 0
    r = _run(client, "state", "pwd; echo $MY_VAR $local_var; sh -c 'echo $MY_VAR'; false")
    assert r["output"] == "/tmp\n42 7\n42\n" and r["exit_code"] == 1
    assert _run(client, "state", "echo 'it''s' \"quoted\" $((1+2)) hi!")["output"] == "its quoted 3 hi!\n"
    assert _run(client, "state", "printf 'no newline'")["output"] == "no newline"
    assert "state" in client.get("/sessions").json()["sessions"]
    _error(client.post("/sessions", json={"name": "state"}), 400, "invalid_request")
    client.delete("/sessions/state").raise_for_status()
    _error(client.post("/sessions/state/run", json={"command": "true"}), 404, "not_found")


@pytest.fixture(params=["bash", "sh"])
def shell_env(request, tmp_path) -> dict:
    """A session's env for each shell the agent may run: bash, or POSIX sh (a PATH without bash, with
    only `sleep`), as in images without bash."""
    if request.param == "bash":
        return {}
    os.symlink(shutil.which("sleep"), tmp_path / "sleep")
    return {"PATH": str(tmp_path)}


def test_session_timeout_interrupts_and_session_stays_usable(client, shell_env):
    client.post("/sessions", json={"name": "slow", "env": shell_env}).raise_for_status()
    try:
        _run(client, "slow", "export KEEP=yes")
        r = _run(client, "slow", "sleep 30; echo not-reached", timeout=0.5)
        assert r["timed_out"] is True and r["exit_code"] is None and "not-reached" not in r["output"]
        r = _run(client, "slow", "i=0; while true; do i=$((i+1)); done", timeout=0.5)  # builtins only
        assert r["timed_out"] is True
        assert _run(client, "slow", "echo $KEEP")["output"] == "yes\n"
    finally:
        client.delete("/sessions/slow")


def test_session_whose_shell_ignores_interrupts_is_replaced_in_the_same_cwd(client, shell_env):
    client.post("/sessions", json={"name": "stuck", "env": shell_env}).raise_for_status()
    try:
        _run(client, "stuck", "cd / && export GONE=1")
        r = _run(client, "stuck", "trap '' INT; while :; do :; done", timeout=0.3)
        assert r["timed_out"] is True and "replaced by a new one in /" in r["output"]
        assert _run(client, "stuck", "pwd; echo ${GONE:-unset}")["output"] == "/\nunset\n"
    finally:
        client.delete("/sessions/stuck")


def test_session_interrupt_stops_the_running_command(agent, client, shell_env):
    client.post("/sessions", json={"name": "intr", "env": shell_env}).raise_for_status()
    try:
        _run(client, "intr", "export KEEP=yes")
        with ThreadPoolExecutor(1) as pool, agent.client() as other:
            pending = pool.submit(_run, client, "intr", "sleep 30; echo not-reached")
            time.sleep(0.5)
            assert other.post("/sessions/intr/interrupt").json() == {}
            r = pending.result(timeout=10)
        assert r["exit_code"] == 130 and r["timed_out"] is False and "not-reached" not in r["output"]
        assert _run(client, "intr", "echo alive $KEEP")["output"] == "alive yes\n"
        # an interrupt with nothing running changes nothing: the next command's output is its own
        assert client.post("/sessions/intr/interrupt").json() == {}
        time.sleep(0.2)
        assert _run(client, "intr", "echo next")["output"] == "next\n"
    finally:
        client.delete("/sessions/intr")


def test_session_output_cap_exit_and_stdin(client):
    client.post("/sessions", json={"name": "cap", "cwd": "/", "env": {"SESSION_VAR": "v"}}).raise_for_status()
    try:
        r = _run(client, "cap", "head -c 100000 /dev/zero | tr '\\0' y; echo $SESSION_VAR; pwd",
                 max_output_bytes=10)
        assert r["output"] == "y" * 10 and r["truncated"] is True and r["exit_code"] == 0
        assert _run(client, "cap", "cat; echo read-nothing")["output"] == "read-nothing\n"
        r = _run(client, "cap", "exit 4")
        assert r["exit_code"] == 4 and "exited" in r["output"]
        assert _run(client, "cap", "pwd; echo $SESSION_VAR")["output"] == "/\nv\n"
    finally:
        client.delete("/sessions/cap")


def test_session_without_bash_uses_sh(tmp_path, client):
    """A PATH without bash (only `sleep`): the session falls back to /bin/sh and keeps its behaviour."""
    os.symlink(shutil.which("sleep"), tmp_path / "sleep")
    client.post("/sessions", json={"name": "posix", "env": {"PATH": str(tmp_path)}}).raise_for_status()
    try:
        assert _run(client, "posix", "cd / && export V=1")["exit_code"] == 0
        r = _run(client, "posix", "sleep 30", timeout=0.5)
        assert r["timed_out"] is True
        assert _run(client, "posix", "echo $V; pwd; echo ${BASH_VERSION:-nobash}")["output"] == "1\n/\nnobash\n"
    finally:
        client.delete("/sessions/posix")


# -- files -----------------------------------------------------------------------------------------------

def test_file_binary_round_trip_and_mode(agent, client):
    data = bytes(range(256)) * 1000
    r = client.put("/files", params={"path": "bin/data.bin", "mode": "0750"}, content=data)
    assert r.json() == {"path": os.path.join(agent.workdir, "bin/data.bin"), "size": len(data)}
    got = client.get("/files", params={"path": "bin/data.bin"})
    assert got.content == data and got.headers["content-length"] == str(len(data))
    assert os.stat(os.path.join(agent.workdir, "bin/data.bin")).st_mode & 0o777 == 0o750
    assert client.put("/files", params={"path": "empty"}, content=b"").json()["size"] == 0
    assert client.get("/files", params={"path": "empty"}).content == b""
    odd = "odd dir/naïve;x+y&z=1.txt"
    client.put("/files", params={"path": odd}, content=b"odd").raise_for_status()
    assert Path(agent.workdir, odd).read_bytes() == b"odd"
    assert client.get("/files", params={"path": odd}).content == b"odd"


def test_100_mb_round_trip_keeps_agent_memory_flat(agent, client):
    block = os.urandom(1 << 20)
    sent = hashlib.sha256()

    def upload():
        for i in range(100):
            chunk = block[i:] + block[:i]
            sent.update(chunk)
            yield chunk

    r = client.put("/files", params={"path": "big.bin"}, content=upload())
    assert r.json()["size"] == 100 << 20
    received, size = hashlib.sha256(), 0
    with client.stream("GET", "/files", params={"path": "big.bin"}) as response:
        for chunk in response.iter_bytes():
            received.update(chunk)
            size += len(chunk)
    assert size == 100 << 20 and received.hexdigest() == sent.hexdigest()
    assert agent.peak_rss_mb() < 60, "agent peak RSS %.0f MB: a file passed through memory" % agent.peak_rss_mb()
    client.delete("/files", params={"path": "big.bin"})


def test_write_is_atomic_and_a_broken_upload_leaves_nothing(agent, client):
    target = os.path.join(agent.workdir, "atomic.txt")
    old, new = b"a" * (8 << 20), b"b" * (8 << 20)
    client.put("/files", params={"path": "atomic.txt"}, content=old).raise_for_status()
    torn, stop = [], threading.Event()

    def read_while_writing():
        while not stop.is_set():
            with open(target, "rb") as f:
                content = f.read()
            if content not in (old, new):
                torn.append(len(content))

    reader = threading.Thread(target=read_while_writing)
    reader.start()
    try:
        for _ in range(3):
            client.put("/files", params={"path": "atomic.txt"}, content=new).raise_for_status()
            client.put("/files", params={"path": "atomic.txt"}, content=old).raise_for_status()
    finally:
        stop.set()
        reader.join()
    assert not torn, "readers saw half-written files of sizes %s" % torn[:5]
    # An upload cut off mid-body: the old content stays, no temp file is left behind.
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(agent.socket_path)
        raw.sendall(b"PUT /files?path=atomic.txt HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer %s\r\n"
                    b"Content-Length: 1000000\r\n\r\npartial" % agent.token.encode())
    time.sleep(0.3)
    assert open(target, "rb").read() == old
    assert sorted(os.listdir(agent.workdir)).count("atomic.txt") == 1
    assert not [n for n in os.listdir(agent.workdir) if "orchard-tmp" in n]


def test_stat_list_delete(agent, client):
    base = os.path.join(agent.workdir, "tree")
    os.makedirs(os.path.join(base, "dir/inner"))
    Path(base, "file.txt").write_text("hello")
    os.symlink("file.txt", os.path.join(base, "link"))
    info = client.get("/files/stat", params={"path": "tree/file.txt"}).json()
    assert info["size"] == 5 and info["is_dir"] is False and info["name"] == "file.txt"
    assert info["path"] == os.path.join(base, "file.txt")
    assert info["mode"] == os.stat(os.path.join(base, "file.txt")).st_mode & 0o7777
    assert client.get("/files/stat", params={"path": "tree/link"}).json()["is_symlink"] is True
    entries = client.get("/files/list", params={"path": "tree"}).json()["entries"]
    assert [(e["name"], e["is_dir"]) for e in entries] == [("dir", True), ("file.txt", False), ("link", False)]
    _error(client.get("/files/stat", params={"path": "tree/missing"}), 404, "not_found")
    _error(client.get("/files/list", params={"path": "tree/file.txt"}), 400, "invalid_request")
    assert "recursive=1" in _error(client.delete("/files", params={"path": "tree/dir"}), 400, "invalid_request")
    client.delete("/files", params={"path": "tree/file.txt"}).raise_for_status()
    client.delete("/files", params={"path": "tree", "recursive": "1"}).raise_for_status()
    assert not os.path.exists(base)
    _error(client.delete("/files", params={"path": "tree"}), 404, "not_found")


# -- tar -------------------------------------------------------------------------------------------------

def _tar(members) -> bytes:
    """A tar from (TarInfo-fields dict, data) pairs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for spec, data in members:
            info = tarfile.TarInfo(spec.pop("name"))
            for key, value in spec.items():
                setattr(info, key, value)
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def test_tar_round_trip(agent, client, tmp_path):
    src = Path(agent.workdir, "project")
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("print('hi')\n")
    (src / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(src / "run.sh", 0o755)
    os.symlink("pkg/mod.py", src / "alias.py")
    with client.stream("GET", "/tar", params={"path": "project"}) as response:
        assert response.headers["content-type"] == "application/x-tar"
        archive = response.read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path / "down")
    assert (tmp_path / "down/pkg/mod.py").read_text() == "print('hi')\n"
    assert os.readlink(tmp_path / "down/alias.py") == "pkg/mod.py"
    assert os.stat(tmp_path / "down/run.sh").st_mode & 0o777 == 0o755

    r = client.put("/tar", params={"path": "copy"}, content=iter([archive[:5000], archive[5000:]]))
    assert r.json() == {"path": os.path.join(agent.workdir, "copy"), "files": 3}
    assert client.post("/exec", json={"command": "./run.sh && cat alias.py", "cwd": "copy"}).json()["stdout"] \
        == "run\nprint('hi')\n"
    # Into an existing directory: named files are replaced, the rest is kept.
    Path(agent.workdir, "copy", "extra.txt").write_text("kept")
    update = _tar([({"name": "pkg/mod.py"}, b"new\n")])
    assert client.put("/tar", params={"path": "copy"}, content=update).json()["files"] == 1
    assert Path(agent.workdir, "copy/pkg/mod.py").read_text() == "new\n"
    assert Path(agent.workdir, "copy/extra.txt").read_text() == "kept"
    assert not [n for n in os.listdir(agent.workdir) if "orchard-tar" in n]


@pytest.mark.parametrize("members, why", [
    ([({"name": "ok.txt"}, b"ok"), ({"name": "../evil"}, b"x")], ".."),
    ([({"name": "ok.txt"}, b"ok"), ({"name": "/tmp/evil-abs"}, b"x")], "absolute"),
    ([({"name": "up", "type": tarfile.SYMTYPE, "linkname": "../.."}, None),
      ({"name": "up/evil"}, b"x")], "outside"),
    ([({"name": "self", "type": tarfile.SYMTYPE, "linkname": "."}, None),
      ({"name": "esc", "type": tarfile.SYMTYPE, "linkname": "self/.."}, None)], "outside"),
    ([({"name": "abs", "type": tarfile.SYMTYPE, "linkname": "/etc"}, None)], "absolute"),
    ([({"name": "dev", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, None)], "device"),
    ([({"name": "hard", "type": tarfile.LNKTYPE, "linkname": "../outside"}, None)], ".."),
])
def test_unsafe_tar_is_refused_and_nothing_is_written(agent, client, members, why):
    parent = Path(agent.workdir, "unsafe")
    parent.mkdir(exist_ok=True)
    before = sorted(os.listdir(parent))
    message = _error(client.put("/tar", params={"path": "unsafe/target"}, content=_tar(members)),
                     400, "invalid_request")
    assert why in message and "nothing was written" in message
    assert sorted(os.listdir(parent)) == before  # no target, no temp dir
    assert not os.path.exists(os.path.join(agent.workdir, "evil"))


def test_tar_errors(client):
    _error(client.get("/tar", params={"path": "no-such-dir"}), 404, "not_found")
    _error(client.put("/tar", params={"path": "t"}, content=b"this is not a tar" * 100), 400, "invalid_request")


# -- bad requests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, words", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b"", "JSON object"),
    (json.dumps({"command": ""}), "must not be empty"),
    (json.dumps({"command": []}), "must not be empty"),
    (json.dumps({}), "command is required"),
    (json.dumps({"command": "true", "timeout": -1}), "timeout"),
    (json.dumps({"command": "true", "timeout": "soon"}), "timeout"),
    (json.dumps({"command": "true", "max_output_bytes": 0}), "max_output_bytes"),
    (json.dumps({"command": "true", "env": {"A": 1}}), "env"),
    (json.dumps({"command": "true", "cwd": "no/such/dir"}), "not a directory"),
    (json.dumps({"command": "true", "bogus": 1}), "unknown field(s) bogus"),
    (json.dumps({"command": [1, 2]}), "only strings"),
])
def test_bad_exec_requests_get_clear_400s(client, body, words):
    message = _error(client.post("/exec", content=body), 400, "invalid_request")
    assert words in message


def test_bad_requests_elsewhere(client):
    assert "path" in _error(client.get("/files"), 400, "invalid_request")
    _error(client.get("/files", params={"path": "missing.txt"}), 404, "not_found")
    _error(client.get("/files", params={"path": "."}), 400, "invalid_request")
    _error(client.put("/files", params={"path": "x", "mode": "999"}, content=b""), 400, "invalid_request")
    _error(client.get("/nope"), 404, "not_found")
    assert "POST /exec" in _error(client.get("/exec"), 405, "invalid_request")
    _error(client.post("/sessions", json={"name": "bad name!"}), 400, "invalid_request")
    _error(client.post("/sessions/none/run", json={"command": "true"}), 404, "not_found")
    client.post("/sessions", json={"name": "t"}).raise_for_status()
    _error(client.post("/sessions/t/run", json={"command": " "}), 400, "invalid_request")
    _error(client.post("/sessions/t/run", json={"command": "true", "timeout": 0}), 400, "invalid_request")
    client.delete("/sessions/t").raise_for_status()
    # The connection survives all of these errors.
    assert client.post("/exec", json={"command": "echo still"}).json()["stdout"] == "still\n"


def test_oversized_bodies_get_413():
    small = RunningAgent(env={"ORCHARD_AGENT_MAX_BODY": str(1 << 20), "ORCHARD_AGENT_MAX_JSON": "1000"})
    try:
        with small.client() as c:
            assert "ORCHARD_AGENT_MAX_BODY" in _error(
                c.put("/files", params={"path": "f"}, content=b"x" * (2 << 20)), 413, "too_large")
            _error(c.put("/files", params={"path": "f"}, content=iter([b"x" * (1 << 19)] * 4)), 413, "too_large")
            assert "ORCHARD_AGENT_MAX_JSON" in _error(
                c.post("/exec", json={"command": "echo " + "x" * 2000}), 413, "too_large")
            assert not os.path.exists(os.path.join(small.workdir, "f"))
            assert not [n for n in os.listdir(small.workdir) if "orchard-tmp" in n]
            assert c.post("/exec", json={"command": "true"}).json()["exit_code"] == 0
    finally:
        small.stop()
