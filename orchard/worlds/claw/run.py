"""How a sandbox starts the Claw world: `python3 -I -S .../claw/run.py COMMAND ...` (see __main__.py).

`-I -S`: no site-packages and nothing of the environment, so the interpreter starts in ~10 ms; the world is
imported as the top-level package `claw` from the directory above this file (it imports nothing but the
standard library and itself, relatively), never the rest of Orchard. This file's own directory is taken
off sys.path, should it be run without -I: its calendar.py would hide the standard library's."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]
sys.path.insert(0, os.path.dirname(HERE))

from claw.__main__ import main  # noqa: E402 — after sys.path is set

sys.exit(main())
