"""The neutral actions of cross-harness translation: what a tool call does, whatever harness made it. A
harness's dialect (orchard/core/dialect.py) reads each of its recorded calls into one of these and writes
one of these back as its own call, so a trajectory of one harness can be rendered as another would have
recorded it.

| action    | what it does                                                                                   |
|-----------|------------------------------------------------------------------------------------------------|
| `Shell`   | runs a command in the task's working directory                                                 |
| `View`    | shows a file with its lines numbered (a range of them), or lists a directory                   |
| `Create`  | writes a file (its directory made), or appends to one                                          |
| `Replace` | replaces the one exact occurrence of a text in a file, failing when there is none or several  |
| `Edits`   | several replacements in turn, each of the first occurrence or of all; fails when none changed |
| `Insert`  | inserts lines after line N of a file (0: at the top)                                           |
| `Submit`  | ends the run (the harness's submit tool, command or final reply)                               |
| `McpCall` | calls a tool of one of the task's MCP servers with its JSON arguments                          |

Each has a shell form that does the same thing (orchard/util/shell_forms.py), for harnesses whose tools
cannot express it directly. A call that no action expresses is refused (`UntranslatableCall`), never
guessed."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Union


class UntranslatableCall(ValueError):
    """A recorded call that no neutral action expresses, or that the target harness's tools cannot."""


class UnreplayableCall(UntranslatableCall):
    """A recorded call whose effect on the files cannot be repeated exactly in a fresh sandbox."""


@dataclass(frozen=True)
class Shell:
    command: str


@dataclass(frozen=True)
class View:
    path: str
    view_range: tuple[int, int] | None = None  # (first, last) line, last -1: to the end
    is_dir: bool = False


@dataclass(frozen=True)
class Create:
    path: str
    content: str
    overwrites: bool | None = None  # whether the file existed (when the source harness says; None: not known)
    append: bool = False  # add to the end of the file


@dataclass(frozen=True)
class Replace:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Edits:
    """Each (old, new, replace_all) applied in turn to the text (the first occurrence, or all); an error,
    changing nothing, when the text comes out unchanged."""

    path: str
    edits: tuple[tuple[str, str, bool], ...]


@dataclass(frozen=True)
class Insert:
    """`text` as lines after line `line` (0: at the top)."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class Submit:
    summary: str | None = None


@dataclass(frozen=True)
class McpCall:
    """A tool of one of the task's MCP servers (docs/tools-mcp.md): react and ZeroClaw offer it as the function
    tool `<server>__<tool>`, a shell as `mcp-call SERVER TOOL '<arguments>'`. The Claw world's actions are such
    calls; a translation that dropped them would train on a run without its work."""

    server: str
    tool: str
    arguments: str  # the JSON object as the model wrote it (text: the action stays hashable)


Action = Union[Shell, View, Create, Replace, Edits, Insert, Submit, McpCall]


def new_file_in_workdir(action: Create, workdir: str) -> bool:
    """Whether `action` creates a file known not to exist, directly in the working directory (a directory known
    to exist): what a file tool that refuses existing files, or missing directories, can write."""
    directory = posixpath.dirname(posixpath.normpath(posixpath.join(workdir, action.path)))
    return action.overwrites is False and directory == posixpath.normpath(workdir)
