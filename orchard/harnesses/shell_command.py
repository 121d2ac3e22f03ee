"""How harness commands are handed to the sandbox: through a shell, with stderr merged into stdout so
the agent reads both streams interleaved as a terminal would show them."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

POSIX_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def shell_argv(command: str, interpreter: Sequence[str] = ("bash", "-c")) -> list[str]:
    """argv running `command` under `interpreter`. For a POSIX shell, `exec 2>&1;` first on the same line
    merges the streams (line numbers in the shell's own errors stay right); other interpreters get the
    command unchanged and their stderr is appended after stdout by the caller."""
    if interpreter and posixpath.basename(interpreter[0]) in POSIX_SHELLS:
        return [*interpreter, f"exec 2>&1; {command}"]
    return [*interpreter, command]
