"""A task's services (`POST /services`, `GET /services`, `POST /services/exec`): long-running processes the
task provides inside the sandbox (a mail server, a calendar, an MCP server), kept apart from the workload.

Graders trust a service's state, so the agent under test must not be able to kill a service or edit its
data behind its API. Each service runs under the services' own uid (`--service-user`, apart from both the
commands' and the agent's), in the agent's pid namespace (the workload, in a namespace of its own, cannot
even see it) and with its state in a directory only that uid can enter: `STATE_ROOT/<name>`, made by the
service's own first step with umask 077 in STATE_ROOT, which the backend binds there owned by that uid
(mode 0700, a mount point: the workload can neither enter, rename nor remove it). Only a sandbox whose
agent runs apart from its commands with the capability to start processes as another user, and has that
directory (the local backend as root, for a spec with `services`), can give that; elsewhere
`POST /services` is refused rather than weakened.

A service's stdout and stderr are kept by the agent (the last LOG_MAX bytes) and returned by `GET /services`
with whether it still runs. A service may declare how to tell it is ready (a port, a health check);
`POST /services/wait` (services_ready.py) waits for that. `POST /services/exec` runs one command like `POST /exec`, but as the services'
user in the agent's namespace: a grader's check reads their state and talks to them there."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

from . import fields
from .execs import ExecSpec, run_whole
from .wire import ApiError, bad_request

USER = None  # (uid, gid) of the services, from --service-user; None: services cannot be kept apart here
STATE_ROOT = "/.orchard/run/services"  # the local backend's bwrap.SERVICES_MOUNT
LOG_MAX = 256 << 10
LOG_DRAIN_S = 1.0
MAX_SERVICES = 32
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
SERVICE_FIELDS = ("name", "command", "env", "seed_dir", "port", "health_check")
# The service's first step, as its own user: its state directory (refusing one someone else made), the
# seed copied in, then the command itself, in that directory.
START = r"""
umask 077
mkdir "$ORCHARD_SERVICE_STATE" || exit 125
if [ -n "$ORCHARD_SERVICE_SEED" ]; then
  cp -R "$ORCHARD_SERVICE_SEED"/. "$ORCHARD_SERVICE_STATE"/ || exit 125
fi
cd "$ORCHARD_SERVICE_STATE" || exit 125
exec /bin/sh -c "$ORCHARD_SERVICE_COMMAND"
"""

_services = {}
_lock = threading.Lock()


class Service:
    def __init__(self, name: str, proc: subprocess.Popen, port=None, health_check=None):
        self.name = name
        self.proc = proc
        self.port = port
        self.health_check = health_check
        self.ready = False  # set once by services_ready.py, and kept
        self.not_ready = None  # why not yet, as last seen
        self.started = time.time()
        self.log = bytearray()
        self.dropped = 0
        self._reader = threading.Thread(target=self._read, name="service-log-" + name, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            while True:
                data = self.proc.stdout.read1(65536)
                if not data:
                    return
                with _lock:
                    self.log += data
                    over = len(self.log) - LOG_MAX
                    if over > 0:
                        del self.log[:over]
                        self.dropped += over
        finally:
            self.proc.stdout.close()
            self.proc.wait()

    def status(self) -> dict:
        code = self.proc.poll()
        if code is not None:
            # Its last words may still be in the pipe: let the reader take them (a child it left behind
            # may hold the pipe open, hence the bound).
            self._reader.join(LOG_DRAIN_S)
        with _lock:
            log = bytes(self.log)
            dropped = self.dropped
        return {"name": self.name, "pid": self.proc.pid, "running": code is None,
                "exit_code": None if code is None else (code if code >= 0 else 128 - code),
                "state_dir": state_dir(self.name), "log": log.decode("utf-8", "replace"),
                "log_dropped_bytes": dropped, "port": self.port, "health_check": self.health_check,
                "ready": self.ready, "not_ready": None if self.ready else self.not_ready}


def state_dir(name: str) -> str:
    return STATE_ROOT + "/" + name


def configure(text: str):
    """`--service-user UID:GID`."""
    global USER
    from .identity import parse_ids

    USER = parse_ids(text, "--service-user")


def _child() -> dict:
    if USER is None:
        raise ApiError(400, "invalid_request", "this sandbox cannot keep task services apart from its commands "
                       "(its agent was started without --service-user: it runs as its commands' user, or cannot "
                       "start processes as another); create it with services=True on a backend that has them "
                       "(the local backend as root; docs/services.md)")
    try:
        root = os.stat(STATE_ROOT)
    except OSError:
        root = None
    if root is None or root.st_uid != USER[0] or root.st_mode & 0o077:
        raise ApiError(400, "invalid_request", "the services' state directory %s is missing, or not theirs alone "
                       "(the backend makes it for a spec with services=True)" % STATE_ROOT)
    return {"user": USER[0], "group": USER[1], "extra_groups": []}


def handle_start(req) -> dict:
    body = req.json()
    fields.reject_unknown(body, SERVICE_FIELDS, "a service")
    name = fields.optional_str(body, "name") or ""
    if not NAME.match(name):
        raise bad_request("service name %r must be 1-63 of a-z, 0-9, '_' and '-', starting with a letter" % name)
    command = fields.optional_str(body, "command")
    if not command or not command.strip():
        raise bad_request("service %s needs a command (a shell command line)" % name)
    seed = fields.optional_str(body, "seed_dir")
    port, health_check = _readiness(body, name)
    child = _child()
    env = dict(req.context.env)
    env.update(fields.str_dict(body, "env"))
    env.update(STATE_ROOT=STATE_ROOT, ORCHARD_SERVICE_NAME=name, ORCHARD_SERVICE_STATE=state_dir(name),
               ORCHARD_SERVICE_COMMAND=command,
               ORCHARD_SERVICE_SEED=req.context.resolve(seed, "seed_dir") if seed else "")
    with _lock:
        if name in _services:
            raise bad_request("service %s is started already" % name)
        if len(_services) >= MAX_SERVICES:
            raise bad_request("a sandbox runs at most %d services" % MAX_SERVICES)
        # Started by the agent itself, not through the workload's spawner: the agent's pid namespace.
        proc = subprocess.Popen(["/bin/sh", "-c", START], cwd="/", env=env, start_new_session=True,
                                close_fds=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, **child)
        _services[name] = service = Service(name, proc, port, health_check)
    return service.status()


def _readiness(body: dict, name: str):
    port = body.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise bad_request("service %s: port must be a TCP port number (1-65535), not %r" % (name, port))
    health_check = fields.optional_str(body, "health_check")
    if health_check is not None and (port is None or not health_check.startswith("/")
                                     or any(c.isspace() for c in health_check)):
        raise bad_request("service %s: health_check must be a URL path starting with '/' (no spaces), and needs "
                          "a port, not %r" % (name, health_check))
    return port, health_check


def chosen(names) -> list:
    """The services named (all of them for None), in the order asked; 400 for a name not started."""
    with _lock:
        if names is None:
            return list(_services.values())
        missing = [n for n in names if n not in _services]
        if missing:
            raise bad_request("no service named %s was started in this sandbox" % ", ".join(map(repr, missing)))
        return [_services[n] for n in names]


def handle_list(req) -> dict:
    with _lock:
        services = list(_services.values())
    return {"services": [service.status() for service in services]}


def handle_exec(req) -> dict:
    child = _child()
    spec = ExecSpec(req.json(), req.context)
    return run_whole(spec, popen=subprocess.Popen, child=child)
