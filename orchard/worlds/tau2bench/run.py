"""How a sandbox starts a tau2-bench world: `python -I .../tau2bench/run.py COMMAND ...` (see __main__.py).

`-I`: nothing of the environment or the current directory on sys.path (nothing the agent writes is
imported), but site-packages, where tau2 and pydantic are. Orchard is imported from the directory above the
`orchard/` this file is in — the package the host image shows read-only in every sandbox — so the world runs
the code of the Orchard that made the task."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]
sys.path.insert(0, ROOT)

from orchard.worlds.tau2bench.__main__ import main  # noqa: E402 — after sys.path is set

sys.exit(main())
