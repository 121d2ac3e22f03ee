"""`python -I -m orchard.worlds.tau2bench COMMAND`, what a tau2-bench task runs inside its sandbox:

    serve --port N [--seed FILE]   the domain's database as a service (in its state directory; seed.json there)
    grade                          the grader: the task's criteria from stdin, the reward last

A seed that cannot be used, or tau2 missing, ends `serve` at once with exit status 2 and the reason on
stderr (the trial's environment error quotes it)."""

from __future__ import annotations

import os
import sys

USAGE = """usage: python -m orchard.worlds.tau2bench serve --port N [--seed FILE]
       python -m orchard.worlds.tau2bench grade < criteria.json"""


def main(argv: list | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else ""
    if command == "serve" and len(args) in (2, 4) and args[0] == "--port":
        seed = args[3] if len(args) == 4 and args[2] == "--seed" else None
        if len(args) == 4 and seed is None:
            print(USAGE, file=sys.stderr)
            return 2
        return _serve(int(args[1]), seed)
    if command == "grade" and not args:
        from .grade import main as grade
        return grade(sys.stdin.read())
    print(USAGE, file=sys.stderr)
    return 2


def _serve(port: int, seed: str | None) -> int:
    from ..claw.base import SEED_FILE, SeedError, load_seed
    from ..claw.http_server import serve
    from .domain import Tau2Missing
    from .service import Tau2Domain

    state_dir = os.getcwd()
    try:
        service = Tau2Domain(load_seed(seed or os.path.join(state_dir, SEED_FILE)), state_dir=state_dir)
    except (SeedError, Tau2Missing, ValueError) as exc:
        print(f"tau2 service: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    serve(service, port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
