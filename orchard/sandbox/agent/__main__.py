"""Start the agent: `python -m orchard_agent --listen unix:PATH|tcp:HOST:PORT|fd:N [--workdir DIR]
[--user UID:GID [--agent-user UID:GID] [--init-user UID:GID]] [--gateway unix:PATH|tcp:HOST:PORT]
[--workload-cgroup-fds N[,M...]] [--service-user UID:GID]`.

`--gateway`: relay 127.0.0.1:4000 (in the sandbox's network namespace) to the model gateway there; see
forward.py. It listens before the agent reports READY.

`--user`: the commands' user, and `--agent-user` the agent's own, set before anything is served; see
identity.py. With `--user`, the agent first tries to give its commands a pid namespace of their own, in
which it has no pid (they cannot signal it); `--init-user` is the uid of that namespace's init (default:
the commands'); see pidns.py.

`--service-user`: the uid the task's services run as, apart from the commands and the agent (needs the
agent's CAP_SETUID, kept with `--agent-user`); without it services are refused (services.py).

`--workload-cgroup-fds`: open `cgroup.procs` files of the sandbox's `workload` cgroup(s), into which the
agent puts the process that starts its commands (or, where that cannot work, itself) before serving; see
workload_cgroup.py.

The token comes from ORCHARD_AGENT_TOKEN_FILE (a file holding it) or ORCHARD_AGENT_TOKEN. The environment
its commands and shells start from comes from ORCHARD_AGENT_ENV_FILE (a JSON object of names to values),
read with the token, before the agent takes the sandbox's identity: the local backend starts the agent
with an environment of its own (no spec's or image's variable reaches the agent's loader or interpreter)
and hands the workload's over as that file. Without it the commands get the agent's environment, minus
the token's variables and the PYTHONHOME/PYTHONPATH it may have been started with. Once listening it
prints `READY <address>` (with the bound port for tcp:...:0) and nothing else on stdout.

Backends start it with `-c` (orchard/sandbox/bundle.py, `agent_launcher`), which skips runpy; either
way the directory it started in is taken off sys.path first (`_drop_start_dir`)."""

from __future__ import annotations

import gc
import os
import signal
import sys


SCRUBBED_ENV = ("ORCHARD_AGENT_TOKEN", "ORCHARD_AGENT_TOKEN_FILE", "ORCHARD_AGENT_ENV_FILE", "PYTHONHOME",
                "PYTHONPATH")
DEFAULT_MAX_BODY = 4 << 30
DEFAULT_MAX_JSON = 16 << 20


def _fail(message: str):
    sys.stderr.write("orchard-agent: %s\n" % message)
    sys.exit(2)


def _read_token() -> str:
    path = os.environ.get("ORCHARD_AGENT_TOKEN_FILE")
    if path:
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError as exc:
            _fail("cannot read the token file ORCHARD_AGENT_TOKEN_FILE=%s: %s" % (path, exc.strerror))
    else:
        token = (os.environ.get("ORCHARD_AGENT_TOKEN") or "").strip()
    if not token:
        _fail("no token: set ORCHARD_AGENT_TOKEN_FILE (a file holding it) or ORCHARD_AGENT_TOKEN; "
              "the agent refuses to serve without one")
    return token


def _read_workload_env():
    """The commands' environment from ORCHARD_AGENT_ENV_FILE, or None without one."""
    path = os.environ.get("ORCHARD_AGENT_ENV_FILE")
    if not path:
        return None
    import json

    try:
        with open(path, "rb") as f:
            env = json.loads(f.read())
    except (OSError, ValueError) as exc:
        _fail("cannot read the commands' environment ORCHARD_AGENT_ENV_FILE=%s: %s" % (path, exc))
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        _fail("ORCHARD_AGENT_ENV_FILE=%s must hold a JSON object of strings" % path)
    return env


def _size_from_env(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        _fail("%s must be a positive number of bytes, not %r" % (name, text))
    return value


def _parse_with_argparse(argv):
    import argparse

    parser = argparse.ArgumentParser(prog="orchard_agent", description="Orchard's in-sandbox agent")
    parser.add_argument("--listen", required=True,
                        help="unix:PATH, tcp:HOST:PORT (port 0: any free one) or fd:N (an inherited socket)")
    parser.add_argument("--workdir", default=None, help="default cwd for commands and relative paths")
    parser.add_argument("--user", default=None, help="UID:GID the commands run as (see identity.py)")
    parser.add_argument("--agent-user", default=None, help="UID:GID of the agent itself")
    parser.add_argument("--init-user", default=None, help="UID:GID of the commands' pid namespace init")
    parser.add_argument("--gateway", default=None,
                        help="unix:PATH or tcp:HOST:PORT of the model gateway, relayed at 127.0.0.1:4000")
    parser.add_argument("--workload-cgroup-fds", default=None,
                        help="N[,M...]: open cgroup.procs files of the workload's cgroup(s)")
    parser.add_argument("--service-user", default=None, help="UID:GID the task's services run as")
    args = parser.parse_args(argv)
    return (args.listen, args.workdir, args.user, args.agent_user, args.init_user, args.gateway,
            args.workload_cgroup_fds, args.service_user)


def parse_args(argv):
    """(listen, workdir). The command lines backends write (`--listen X --workdir Y`, or `--opt=X`) are
    read directly; anything else (--help, a typo, a missing value) goes to argparse, whose import (~1.5 ms)
    every sandbox's start would otherwise pay."""
    options = {"--listen": None, "--workdir": None, "--user": None, "--agent-user": None, "--init-user": None,
               "--gateway": None, "--workload-cgroup-fds": None, "--service-user": None}
    i = 0
    while i < len(argv):
        name, equals, value = argv[i].partition("=")
        if not equals:
            value = argv[i + 1] if i + 1 < len(argv) else None
            i += 1
        if name not in options or value is None or value.startswith("-"):
            return _parse_with_argparse(argv)
        options[name] = value
        i += 1
    if options["--listen"] is None:
        return _parse_with_argparse(argv)
    return (options["--listen"], options["--workdir"], options["--user"], options["--agent-user"],
            options["--init-user"], options["--gateway"], options["--workload-cgroup-fds"], options["--service-user"])


def _drop_start_dir():
    """`python -m` and `-c` put the directory the interpreter started in (as itself, or as '') first on
    sys.path. In a sandbox that is the workdir, which the workload writes: the agent's later imports
    (tempfile, tarfile, traceback, ...) would run the workload's modules of those names inside the agent.
    The agent's own package is imported already, so nothing else is needed from there."""
    if not sys.path:
        return
    try:
        start = os.getcwd()
    except OSError:
        start = None
    if sys.path[0] == "" or (start is not None and os.path.abspath(sys.path[0]) == start):
        del sys.path[0]


def main(argv=None):
    _drop_start_dir()
    # The start allocates many objects and frees few: no collection is worth its time until serving.
    gc.disable()
    # An orchestrator started with Ctrl-C ignored (nohup, `cmd &` in a script) would hand that on to every
    # command: a session's interrupt would then do nothing. Commands start from the defaults instead.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    listen, workdir_arg, user, agent_user, init_user, gateway, cgroup_fds, service_user = parse_args(
        sys.argv[1:] if argv is None else argv)

    token = _read_token()  # first: once the agent has its identity, the token file is no longer readable
    commands_env = _read_workload_env()  # (so is this one)
    if user:
        from . import pidns

        pidns.separate(user, init_user)  # the commands' pid namespace, made while the server is imported
    from .server import make_server
    from .wire import AgentContext

    if user:
        from . import identity

        try:
            why_not = pidns.forked()  # before become(): making the namespace needs CAP_SYS_ADMIN
            identity.become(user, agent_user)
            why_not = pidns.finish(user, agent_user, spawners=bool(cgroup_fds)) or why_not
            if why_not:
                sys.stderr.write("orchard-agent: commands share the agent's pid namespace (%s)\n" % why_not)
        except identity.IdentityError as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail("cannot set up the commands' pid namespace: %s" % exc)
        pidns.watch_init()
    elif agent_user or init_user:
        _fail("--agent-user and --init-user need --user (the commands' user)")
    if service_user:
        if not agent_user:
            _fail("--service-user needs --agent-user: only an agent apart from its commands keeps the "
                  "capability to start services as another user")
        from . import services

        try:
            services.configure(service_user)
        except identity.IdentityError as exc:
            _fail(str(exc))
    if cgroup_fds:
        from . import workload_cgroup

        try:
            workload_cgroup.setup(cgroup_fds)
        except (ValueError, OSError) as exc:
            _fail("cannot put the commands into the workload's cgroup (%s); the sandbox's limits would not "
                  "hold, so the agent refuses to serve" % exc)
    for name in SCRUBBED_ENV:
        os.environ.pop(name, None)
    workdir = os.path.abspath(workdir_arg or os.getcwd())
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as exc:
        _fail("cannot create the workdir %s: %s" % (workdir, exc.strerror))
    os.chdir(workdir)
    if gateway:
        # After the pid namespace's fork (no thread may exist then) and as the agent's own user.
        from .forward import Forwarder

        try:
            Forwarder(gateway).start()
        except (ValueError, OSError) as exc:
            _fail("cannot relay the model gateway at 127.0.0.1:4000 to %s: %s" % (gateway, exc))
    context = AgentContext(token, workdir, dict(os.environ) if commands_env is None else commands_env,
                           max_body=_size_from_env("ORCHARD_AGENT_MAX_BODY", DEFAULT_MAX_BODY),
                           max_json=_size_from_env("ORCHARD_AGENT_MAX_JSON", DEFAULT_MAX_JSON))
    try:
        server = make_server(listen, context)
    except (ValueError, OSError) as exc:
        _fail("cannot listen on %s: %s" % (listen, exc))

    # SIGTERM ends serve_forever through SystemExit, so the finally below still cleans up.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    gc.enable()
    try:
        sys.stdout.write("READY %s\n" % server.address_text)
        sys.stdout.flush()
        if cgroup_fds:
            # After the first answer (the backend's /health): a fork now would slow the rest of the start,
            # and the spawner's move into its cgroup holds up every fork and thread start (the first
            # request's handler) until an RCU grace period has passed.
            server.after_first_request = workload_cgroup.start_soon
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        context.sessions.close_all()
        server.server_close()


if __name__ == "__main__":
    main()
