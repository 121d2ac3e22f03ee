"""Cross-harness distillation, the tool vocabularies of the harnesses that run inside the sandbox: Kimi-CLI
and OpenHands, read into the neutral actions of actions.py and written back as their own calls.

| action  | kimi-cli                                   | openhands                                           |
|---------|--------------------------------------------|-----------------------------------------------------|
| Shell   | `Shell(command)`                           | `terminal(command)`                                 |
| View    | `ReadFile(path, line_offset, n_lines)`;    | `file_editor(view, path, view_range)`, a directory  |
|         | a directory: react's listing via `Shell`   | too                                                 |
| Create  | `WriteFile(path, content)`; append: mode   | `file_editor(create, path, file_text)` for a new    |
|         | `append`                                   | file in an existing directory                       |
| Replace | `StrReplaceFile(path, edit={old, new})`    | `file_editor(str_replace, path, old_str, new_str)`  |
| Edits   | `StrReplaceFile(path, edit=[...])`         | `terminal` with a python3 script                    |
| Insert  | `Shell` with a python3 script              | `file_editor(insert, path, insert_line, new_str)`   |
| Submit  | a reply without tool calls (ends the run)  | `finish(message)`                                   |

Where the target's file tool would refuse what the source's did, the shell form is written instead: Kimi's
WriteFile and OpenHands' create need the file's directory to exist (react's create makes it), and
OpenHands' create refuses an existing file. Only what is known from the source counts: a new file (react
said "Created") directly in the working directory goes to the file tool, other new files to the shell.

Tools with no neutral action (Kimi's Grep, Glob, SetTodoList, Agent; OpenHands' think, task_tracker,
undo_edit, terminal input to a running process) are refused (`UntranslatableCall`), never guessed."""

from __future__ import annotations

import posixpath
from typing import Any

from orchard.recipes.translate.actions import (
    Action,
    Create,
    Edits,
    Insert,
    Replace,
    Shell,
    Submit,
    ToolVocabulary,
    UntranslatableCall,
    View,
    shell_command,
)

OPENHANDS_DIR_VIEW = "Here's the files and directories up to 2 levels deep in"
OPENHANDS_FINISH_DEFAULT = "The task is complete."


def _new_file_in(action: Create, workdir: str) -> bool:
    """Whether `action` creates a file that did not exist, directly in a directory known to exist."""
    directory = posixpath.dirname(posixpath.normpath(posixpath.join(workdir, action.path)))
    return action.overwrites is False and directory == posixpath.normpath(workdir)


# --- kimi-cli -----------------------------------------------------------------------------------------

def _kimi_read(name: str, arguments: dict[str, Any], result: str) -> Action:
    try:
        if name == "Shell":
            if arguments.get("run_in_background"):
                raise UntranslatableCall("kimi-cli Shell with run_in_background has no equivalent")
            return Shell(arguments["command"])
        if name == "ReadFile":
            offset, count = int(arguments.get("line_offset", 1)), arguments.get("n_lines")
            if offset < 1:
                raise UntranslatableCall(f"kimi-cli ReadFile from the end of the file (line_offset {offset})")
            if count is None:
                return View(arguments["path"], (offset, -1) if offset > 1 else None)
            return View(arguments["path"], (offset, offset + int(count) - 1))
        if name == "WriteFile":
            mode = arguments.get("mode", "overwrite")
            if mode not in ("overwrite", "append"):
                raise UntranslatableCall(f"kimi-cli WriteFile mode {mode!r}")
            return Create(arguments["path"], arguments["content"], append=mode == "append")
        if name == "StrReplaceFile":
            edits = arguments["edit"] if isinstance(arguments["edit"], list) else [arguments["edit"]]
            parsed = tuple((e["old"], e["new"], bool(e.get("replace_all", False))) for e in edits)
            if len(parsed) == 1 and not parsed[0][2]:
                return Replace(arguments["path"], parsed[0][0], parsed[0][1])
            return Edits(arguments["path"], parsed)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, UntranslatableCall):
            raise
        raise UntranslatableCall(f"kimi-cli call {name} has invalid arguments {arguments!r}") from None
    raise UntranslatableCall(f"kimi-cli's tool {name!r} has no equivalent in the translation's actions")


def _kimi_write(action: Action, workdir: str) -> tuple[str, dict[str, Any]] | None:
    if isinstance(action, Submit):
        return None  # Kimi ends its turn with a reply that calls no tool
    if isinstance(action, Shell):
        return "Shell", {"command": action.command}
    if isinstance(action, View) and not action.is_dir:
        if action.view_range is None:
            return "ReadFile", {"path": action.path}
        first, last = action.view_range
        return "ReadFile", {"path": action.path, "line_offset": first,
                            **({} if last == -1 else {"n_lines": last - first + 1})}
    if isinstance(action, Create) and (action.append or action.overwrites or _new_file_in(action, workdir)):
        return "WriteFile", {"path": action.path, "content": action.content,
                             **({"mode": "append"} if action.append else {})}
    if isinstance(action, Replace):
        return "StrReplaceFile", {"path": action.path, "edit": {"old": action.old, "new": action.new}}
    if isinstance(action, Edits):
        return "StrReplaceFile", {"path": action.path, "edit": [
            {"old": old, "new": new, **({"replace_all": True} if every else {})} for old, new, every in action.edits]}
    return "Shell", {"command": shell_command(action)}  # a directory's listing as react's, inserts, new files


# --- openhands ----------------------------------------------------------------------------------------

def _openhands_read(name: str, arguments: dict[str, Any], result: str) -> Action:
    try:
        if name == "terminal":
            if arguments.get("is_input") or arguments.get("reset"):
                raise UntranslatableCall("openhands terminal input to a running process (or a reset) has no "
                                         "equivalent")
            return Shell(arguments["command"])
        if name == "finish":
            return Submit(arguments.get("message"))
        if name == "file_editor":
            command, path = arguments["command"], arguments["path"]
            if command == "view":
                view_range = arguments.get("view_range")
                return View(path, tuple(view_range) if view_range else None,
                            is_dir=result.startswith(OPENHANDS_DIR_VIEW))
            if command == "create":
                return Create(path, arguments["file_text"], overwrites=False)
            if command == "str_replace":
                return Replace(path, arguments["old_str"], arguments.get("new_str") or "")
            if command == "insert":
                return Insert(path, int(arguments["insert_line"]), arguments["new_str"])
            raise UntranslatableCall(f"openhands file_editor {command!r} has no equivalent")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, UntranslatableCall):
            raise
        raise UntranslatableCall(f"openhands call {name} has invalid arguments {arguments!r}") from None
    raise UntranslatableCall(f"openhands' tool {name!r} has no equivalent in the translation's actions")


def _openhands_write(action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
    if isinstance(action, Submit):
        return "finish", {"message": action.summary or OPENHANDS_FINISH_DEFAULT}
    if isinstance(action, Shell):
        return "terminal", {"command": action.command}
    if isinstance(action, View):
        return "file_editor", {"command": "view", "path": _absolute(action.path, workdir),
                               **({"view_range": list(action.view_range)} if action.view_range else {})}
    if isinstance(action, Create) and not action.append and _new_file_in(action, workdir):
        return "file_editor", {"command": "create", "path": _absolute(action.path, workdir),
                               "file_text": action.content}
    if isinstance(action, Replace):
        return "file_editor", {"command": "str_replace", "path": _absolute(action.path, workdir),
                               "old_str": action.old, "new_str": action.new}
    if isinstance(action, Insert):
        return "file_editor", {"command": "insert", "path": _absolute(action.path, workdir),
                               "insert_line": action.line, "new_str": action.text}
    return "terminal", {"command": shell_command(action)}


def _absolute(path: str, workdir: str) -> str:
    return posixpath.normpath(posixpath.join(workdir, path))


AGENT_VOCABULARIES: dict[str, ToolVocabulary] = {
    "kimi-cli": ToolVocabulary("kimi-cli", _kimi_read, _kimi_write),
    "openhands": ToolVocabulary("openhands", _openhands_read, _openhands_write),
}
