"""Cross-harness distillation, the tool vocabularies: every harness's tool calls read into neutral actions
(`Shell`, `View`, `Create`, `Replace`, `Submit`) and neutral actions written as that harness's calls.

A harness is one `ToolVocabulary` (vocabularies.py holds them by harness): `read` turns one of its recorded
calls into an action, `write` turns an action into one of its calls (name + arguments), or None where the
harness ends its run with a plain reply instead of a call (Kimi-CLI's way to finish). A harness with only a shell writes
file actions as shell commands that do the same thing:

| action  | react         | mini-swe-agent (`bash`)                                                       |
|---------|---------------|-------------------------------------------------------------------------------|
| Shell   | `bash`        | the command                                                                   |
| View    | `view`        | `cat -n PATH` (react's numbering), `... | sed -n 'A,Bp'` for a range;    |
|         |               | a directory: `echo PATH && find PATH ... | sort`, as react lists it          |
| Create  | `create`      | a quoted heredoc into the file (`truncate -s -1` when the content has no final newline) |
| Replace | `str_replace` | a python3 script replacing the one exact occurrence, failing as react does otherwise |
| Submit  | `submit`      | `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`                                    |

Kimi-CLI (`Shell`, `ReadFile`, `WriteFile`, `StrReplaceFile`) and OpenHands (`terminal`, `file_editor`,
`finish`) are in agents.py; `vocabulary(harness)` (vocabularies.py) finds any of them. `Edits` (Kimi's
StrReplaceFile with several edits or replace_all), `Insert` (OpenHands' insert) and appending (Kimi's
WriteFile mode=append) have shell forms here too."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

MINI_SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# react's directory listing, as its `view` runs it (orchard.harnesses.react.tools)
LIST_COMMAND = "echo {path} && find {path} -mindepth 1 -maxdepth 2 -name '.*' -prune -o -print | sort"


class UntranslatableCall(ValueError):
    """A recorded call that the target harness's tools cannot express (a tool the table does not know)."""


@dataclass(frozen=True)
class Shell:
    command: str


@dataclass(frozen=True)
class View:
    path: str
    view_range: tuple[int, int] | None = None
    is_dir: bool = False


@dataclass(frozen=True)
class Create:
    path: str
    content: str
    overwrites: bool | None = None  # whether the file existed (react says so; None: not known)
    append: bool = False  # add to the end of the file (Kimi's WriteFile mode=append)


@dataclass(frozen=True)
class Replace:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Edits:
    """Kimi's StrReplaceFile: each (old, new, replace_all) applied in turn to the text (the first occurrence,
    or all); an error, changing nothing, when the text comes out unchanged."""

    path: str
    edits: tuple[tuple[str, str, bool], ...]


@dataclass(frozen=True)
class Insert:
    """OpenHands' insert: `text` as lines after line `line` (0: at the top)."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class Submit:
    summary: str | None = None


Action = Union[Shell, View, Create, Replace, Edits, Insert, Submit]


@dataclass(frozen=True)
class ToolVocabulary:
    """How one harness's tool calls map to actions. `read(name, arguments, result)` gets the call's recorded
    result text too (react's `view` of a directory is known to be one by its listing); `write(action,
    workdir)` gets the task's working directory (OpenHands' file_editor takes absolute paths only)."""

    harness: str
    read: Callable[[str, dict[str, Any], str], Action]
    write: Callable[[Action, str], tuple[str, dict[str, Any]] | None]


# --- react ------------------------------------------------------------------------------------------

def _react_read(name: str, arguments: dict[str, Any], result: str) -> Action:
    try:
        if name == "bash":
            return Shell(arguments["command"])
        if name == "view":
            view_range = arguments.get("view_range")
            return View(arguments["path"], tuple(view_range) if view_range else None,
                        is_dir=_looks_like_listing(arguments["path"], result))
        if name == "create":
            overwrites = True if result.startswith("Overwrote ") else False if result.startswith("Created ") else None
            return Create(arguments["path"], arguments["content"], overwrites=overwrites)
        if name == "str_replace":
            return Replace(arguments["path"], arguments["old_str"], arguments["new_str"])
        if name == "submit":
            return Submit(arguments.get("summary"))
    except (KeyError, TypeError):
        raise UntranslatableCall(f"react call {name} has invalid arguments {arguments!r}") from None
    raise UntranslatableCall(f"react has no tool {name!r}")


def _looks_like_listing(path: str, result: str) -> bool:
    """react's `view` shows a file as numbered lines (`     1\t...`) and a directory as a listing."""
    first = result.split("\n", 1)[0]
    return bool(first.strip()) and not re.match(r"\s*\d+\t", first) and not result.startswith("Error:") \
        and not result.endswith(" is empty")


def _react_write(action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
    if isinstance(action, Shell):
        return "bash", {"command": action.command}
    if isinstance(action, View):
        return "view", {"path": action.path, **({"view_range": list(action.view_range)} if action.view_range else {})}
    if isinstance(action, Create) and not action.append:
        return "create", {"path": action.path, "content": action.content}
    if isinstance(action, Replace):
        return "str_replace", {"path": action.path, "old_str": action.old, "new_str": action.new}
    if not isinstance(action, Submit):  # appending, Kimi's edits, an insert: react's bash does them
        return "bash", {"command": shell_command(action)}
    return "submit", ({"summary": action.summary} if action.summary else {})


# --- mini-swe-agent ---------------------------------------------------------------------------------

def _mini_read(name: str, arguments: dict[str, Any], result: str) -> Action:
    if name != "bash" or not isinstance(arguments.get("command"), str):
        raise UntranslatableCall(f"mini-swe-agent has one tool, bash(command); not {name}({arguments!r})")
    command = arguments["command"]
    if command.strip() == MINI_SUBMIT_COMMAND:
        return Submit()
    return Shell(command)


def _mini_write(action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
    return "bash", {"command": shell_command(action)}


def shell_command(action: Action) -> str:
    """The action as one bash command that does what react's tool does."""
    if isinstance(action, Shell):
        return action.command
    if isinstance(action, Submit):
        return MINI_SUBMIT_COMMAND
    path = shlex.quote(action.path)
    if isinstance(action, View):
        if action.is_dir:
            return LIST_COMMAND.format(path=path)
        if action.view_range:
            first, last = action.view_range
            return f"cat -n {path} | sed -n '{first},{'$' if last == -1 else last}p'"
        return f"cat -n {path}"
    if isinstance(action, Create):
        if action.append:  # python3, not a heredoc: appending text without a final newline stays exact
            return _python_script(f"path, text = {action.path!r}, {action.content!r}",
                                  "with open(path, 'a', encoding='utf-8', errors='surrogateescape', newline='') as f:",
                                  "    f.write(text)")
        delimiter = _heredoc_delimiter(action.content)
        body = action.content if action.content.endswith("\n") else action.content + "\n"
        trim = "" if action.content.endswith("\n") or not action.content else f" && truncate -s -1 {path}"
        directory = posixpath.dirname(action.path)
        mkdir = f"mkdir -p {shlex.quote(directory)} && " if directory else ""
        if not action.content:
            return f"{mkdir}: > {path}"
        return f"{mkdir}cat > {path} <<'{delimiter}'{trim}\n{body}{delimiter}"
    if isinstance(action, Edits):
        return _python_script(f"path, edits = {action.path!r}, {list(action.edits)!r}", _READ,
                              "before = text",
                              "for old, new, every in edits:",
                              "    text = text.replace(old, new) if every else text.replace(old, new, 1)",
                              "if text == before:",
                              "    sys.exit('No replacements were made. The old string was not found in the file.')",
                              _WRITE, "print(f'Edited {path}')")
    if isinstance(action, Insert):
        return _python_script(f"path, after, new = {action.path!r}, {action.line!r}, {action.text!r}", _READ,
                              "parts = text.split('\\n')",
                              "lines = [part + '\\n' for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])",
                              "if not 0 <= after <= len(lines):",
                              "    sys.exit(f'insert_line {after} is not within [0, {len(lines)}]')",
                              "text = ''.join(lines[:after] + [line + '\\n' for line in new.split('\\n')] + lines[after:])",
                              _WRITE, "print(f'Edited {path}')")
    return _replace_script(action)


def _heredoc_delimiter(content: str) -> str:
    lines = set(content.splitlines())
    delimiter = "EOF"
    while delimiter in lines:
        delimiter += "_X"
    return delimiter


_READ = ("with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:\n"
         "    text = f.read()")
_WRITE = ("with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:\n"
          "    f.write(text)")


def _python_script(*lines: str) -> str:
    script = "\n".join(["import sys", *lines])
    delimiter = _heredoc_delimiter(script)
    return f"python3 - <<'{delimiter}'\n{script}\n{delimiter}"


def _replace_script(action: Replace) -> str:
    """A python3 script that replaces the one exact occurrence of `old` (bytes as they are: no newline
    translation) and fails, changing nothing, when there is none or more than one."""
    script = "\n".join([
        "import sys",
        f"path, old, new = {action.path!r}, {action.old!r}, {action.new!r}",
        "with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:",
        "    text = f.read()",
        "count = text.count(old)",
        "if count != 1:",
        "    sys.exit(f'old text occurs {count} times in {path}; nothing replaced')",
        "with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:",
        "    f.write(text.replace(old, new, 1))",
        "print(f'Edited {path}')",
    ])
    delimiter = _heredoc_delimiter(script)
    return f"python3 - <<'{delimiter}'\n{script}\n{delimiter}"


react_vocabulary = ToolVocabulary("react", _react_read, _react_write)
mini_vocabulary = ToolVocabulary("mini-swe-agent", _mini_read, _mini_write)
