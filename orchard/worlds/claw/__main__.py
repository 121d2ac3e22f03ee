"""`python -I -m orchard.worlds.claw COMMAND`, what a Claw task runs inside its sandbox:

    serve NAME --port N [--smtp-port M] [--seed FILE]   a service (in its state directory; seed.json there)
    mcp NAME URL                                        the service's tools over MCP (stdio), calling URL
    grade                                               the grader: checks from stdin, the score last
    mcp-endpoints NAME TOOLS                            a task's declared tools over MCP, each calling its
                                                        endpoint (Claw-Eval's tool_endpoints; endpoints.py)
    grade-claw-eval                                     a Claw-Eval task's grader: its scoring from stdin

A seed or fault plan that cannot be used ends `serve` at once with exit status 2 and the reason on stderr
(the trial's environment error quotes it)."""

from __future__ import annotations

import sys

USAGE = """usage: python -m orchard.worlds.claw serve NAME --port N [--smtp-port M] [--seed FILE]
       python -m orchard.worlds.claw mcp NAME URL
       python -m orchard.worlds.claw grade < checks.json
       python -m orchard.worlds.claw mcp-endpoints NAME TOOLS_BASE64
       python -m orchard.worlds.claw grade-claw-eval < scoring.json"""


def main(argv: list | None = None) -> int:
    # by hand, not argparse: its import (re, gettext) would be a fifth of a service's start
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    try:
        if command == "serve" and args:
            name, options = args[0], _options(args[1:], ("--port", "--smtp-port", "--seed"))
            return _serve(name, int(options["--port"]), int(options.get("--smtp-port") or 0), options.get("--seed"))
        if command == "mcp" and len(args) == 2:
            from .mcp_stdio import run
            return run(args[0], args[1])
        if command == "grade" and not args:
            from .grade import main as grade
            return grade(sys.stdin.read())
        if command == "mcp-endpoints" and len(args) == 2:
            from .endpoints import run as run_endpoints
            return run_endpoints(args[0], args[1])
        if command == "grade-claw-eval" and not args:
            from .eval_grade import main as grade_claw_eval
            return grade_claw_eval(sys.stdin.read())
    except (KeyError, ValueError) as exc:
        print(f"{USAGE}\n{exc or 'missing --port'}", file=sys.stderr)
        return 2
    print(USAGE, file=sys.stderr)
    return 2


def _options(args: list, known: tuple) -> dict:
    options = {}
    while args:
        key = args.pop(0)
        if key not in known or not args:
            raise ValueError(f"unknown option or missing value: {key}")
        options[key] = args.pop(0)
    return options


def _serve(name: str, port: int, smtp_port: int, seed: str | None) -> int:
    from .base import SeedError
    from .faults import FaultSpecError
    from .http_server import serve
    from .services import make_service

    try:
        service = make_service(name, seed_path=seed)
    except (SeedError, FaultSpecError, ValueError) as exc:
        print(f"claw {name}: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    if smtp_port:
        from .smtp import start_smtp
        start_smtp(service, smtp_port)
    serve(service, port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
