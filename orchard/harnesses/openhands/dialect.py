"""OpenHands' dialect (orchard/core/dialect.py): its tools as neutral actions and back, its prompt (captured: the
SDK renders it itself, with its tools' descriptions), its framing of tool results, and an exact replay of its
calls.

| action  | OpenHands                                                                                     |
|---------|-----------------------------------------------------------------------------------------------|
| Shell   | `terminal(command)`                                                                           |
| View    | `file_editor(view, path, view_range)`, a directory too (absolute paths: its editor takes no   |
|         | other)                                                                                        |
| Create  | `file_editor(create, path, file_text)` for a file known to be new, directly in the working     |
|         | directory (create refuses an existing file and a missing directory); else through `terminal` |
| Replace | `file_editor(str_replace, path, old_str, new_str)`                                            |
| Edits   | `terminal` with a python3 script                                                              |
| Insert  | `file_editor(insert, path, insert_line, new_str)`                                             |
| Submit  | `finish(message)`                                                                             |

Its think, task_tracker, undo_edit and terminal input to a running process have no action
(`UntranslatableCall`). A terminal result is the output, then its exit-code and working-directory lines.

**Replay.** OpenHands' tools run inside the sandbox, so each recorded call is replayed as one bash command
that does exactly what the tool did (orchard/harnesses/exact_replay.py):
- `terminal(command)`: `cd` into the directory the previous terminal call ended in (its result says so:
  the terminal is one shell for the whole run), then the command;
- `file_editor` create, str_replace, insert: a script; absolute paths only, create refuses an existing file,
  str_replace needs one occurrence (retried stripped), insert goes after line N; read with universal
  newlines, written as UTF-8 keeping the file's mode;
- `file_editor` view, `think`, `task_tracker`, `glob`, `grep`: nothing; `finish` ends the replay.
Refused before a sandbox starts: input to a running process, `undo_edit` (the editor's history is not kept),
a terminal call whose result does not say the directory it ended in (a command still running); at replay
time, an edit of a file that is not UTF-8 text (the editor's encoding detection is not repeated). Not
carried between terminal calls: variables exported by one (each command runs in a new shell)."""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any

from orchard.core.actions import (Action, Create, Insert, Replace, Shell, Submit, UnreplayableCall, UntranslatableCall,
                                  View, new_file_in_workdir)
from orchard.core.dialect import Observed, observation_text
from orchard.core.trajectory import ObservationResult, Trajectory
from orchard.harnesses.captured_dialect import CapturedPromptDialect
from orchard.harnesses.exact_replay import ExactCall, ExactReplay, exact_plan, exact_script
from orchard.util.shell_forms import shell_command

DIR_VIEW = "Here's the files and directories up to 2 levels deep in"
FINISH_DEFAULT = "The task is complete."
TAIL = re.compile(r"\n?\[The command completed with exit code (-?\d+)\.\](?:\n\[[^\n]*\])*\s*\Z", re.S)
FINISHED = re.compile(r"\[Command finished with exit code (-?\d+)\]\s*\Z")
CWD = "[Current working directory: "
NO_EFFECT = {"think", "task_tracker", "glob", "grep"}


class OpenHandsDialect(CapturedPromptDialect):
    # --- its tools ------------------------------------------------------------------------------------

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
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
                    return View(path, tuple(view_range) if view_range else None, is_dir=result.startswith(DIR_VIEW))
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

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]]:
        if isinstance(action, Submit):
            return "finish", {"message": action.summary or FINISH_DEFAULT}
        if isinstance(action, Shell):
            return "terminal", {"command": action.command}
        if isinstance(action, View):
            return "file_editor", {"command": "view", "path": _absolute(action.path, workdir),
                                   **({"view_range": list(action.view_range)} if action.view_range else {})}
        if isinstance(action, Create) and not action.append and new_file_in_workdir(action, workdir):
            return "file_editor", {"command": "create", "path": _absolute(action.path, workdir),
                                   "file_text": action.content}
        if isinstance(action, Replace):
            return "file_editor", {"command": "str_replace", "path": _absolute(action.path, workdir),
                                   "old_str": action.old, "new_str": action.new}
        if isinstance(action, Insert):
            return "file_editor", {"command": "insert", "path": _absolute(action.path, workdir),
                                   "insert_line": action.line, "new_str": action.text}
        return "terminal", {"command": shell_command(action)}

    # --- its framing of tool results -----------------------------------------------------------------

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = observation_text(result)
        finished = FINISHED.search(text)
        tail = TAIL.search(text)
        if function_name == "terminal" and (tail or finished):
            code = int((tail or finished).group(1))
            return Observed(text[:tail.start()] + "\n" if tail else text, code)
        return Observed(text, 1 if text.startswith("ERROR") else 0)

    def result_parts(self, function_name: str, observed: Observed) -> list[dict[str, str]]:
        text = observed.output
        if function_name == "terminal":
            code = observed.returncode
            text = (f"{text.rstrip(chr(10))}\n[The command completed with exit code {code}.]\n"
                    f"[Current working directory: {self.workdir}]\n[Command finished with exit code {code}]")
        return [{"type": "text", "text": text}]

    def result_message(self, call_id: str, function_name: str, observed: Observed) -> dict[str, Any]:
        return {**super().result_message(call_id, function_name, observed), "name": function_name}

    # --- its calls replayed ---------------------------------------------------------------------------

    def replay(self, trajectory: Trajectory, workdir: str) -> ExactReplay:
        return ExactReplay(exact_plan(trajectory, _Planner(workdir)), workdir)


def _absolute(path: str, workdir: str) -> str:
    return posixpath.normpath(posixpath.join(workdir, path))


class _Planner:
    """The exact call for each OpenHands call in turn; the terminal's directory is carried from call to call."""

    def __init__(self, workdir: str) -> None:
        self.cwd = workdir

    def __call__(self, name: str, arguments: dict[str, Any], result: str | None) -> ExactCall:
        exact, self.cwd = exact_call(name, arguments, self.cwd, result)
        return exact


def exact_call(name: str, arguments: dict[str, Any], cwd: str, result: str | None) -> tuple[ExactCall, str]:
    """The bash command that does what OpenHands' tool `name` did (see the module docstring), and the
    terminal's directory after it."""
    if name in NO_EFFECT:
        return ExactCall(None), cwd
    if name == "finish":
        return ExactCall(None, submits=True), cwd
    if name == "terminal":
        if arguments.get("is_input") or arguments.get("reset"):
            raise UnreplayableCall("input to a running process, or a terminal reset")
        after = (result or "").rfind(CWD)
        if after < 0:
            raise UnreplayableCall("its result does not say the directory it ended in (a command still running?)")
        line = result[after + len(CWD):].split("\n", 1)[0]
        command = f"cd {shlex.quote(posixpath.normpath(cwd))} || exit 1\n{arguments['command']}"
        return ExactCall(command), line.rsplit("]", 1)[0]
    if name != "file_editor":
        raise UnreplayableCall("OpenHands' tool has no exact replay (its effect on the files is not repeated here)")
    command, path = arguments["command"], arguments["path"]
    if command == "view":
        return ExactCall(None), cwd
    head = [f"path, command, args = {path!r}, {command!r}, {arguments!r}",
            "if not os.path.isabs(path):",
            "    fail('The path should be an absolute path.')",
            "if command == 'create' and os.path.exists(path):",
            "    fail(f'File already exists at: {path}. Cannot overwrite files using command `create`.')",
            "if command != 'create' and not os.path.exists(path):",
            "    fail(f'The path {path} does not exist. Please provide a valid path.')",
            "if os.path.isdir(path):",
            "    fail(f'The path {path} is a directory.')"]
    if command == "create":
        if arguments.get("file_text") is None:
            raise UnreplayableCall("create without file_text")
        body = ["if not os.path.isdir(os.path.dirname(path)):",
                "    fail(f'the directory of {path} does not exist')",
                "text = args['file_text']"]
    elif command == "str_replace":
        if arguments.get("old_str") is None or arguments.get("new_str") is None or \
                arguments["old_str"] == arguments["new_str"]:
            return ExactCall(None), cwd  # the editor refuses it before touching the file
        body = [_READ,
                "old, new = args['old_str'], args['new_str']",
                "found = [m.start() for m in re.finditer(re.escape(old), text)]",
                "if not found:",
                "    old = old.strip()",
                "    found = [m.start() for m in re.finditer(re.escape(old), text)]",
                "if len(found) != 1:",
                "    fail(f'No replacement was performed ({len(found)} occurrences).')",
                "text = text[:found[0]] + new + text[found[0] + len(old):]"]
    elif command == "insert":
        if arguments.get("insert_line") is None or arguments.get("new_str") is None:
            return ExactCall(None), cwd
        body = [_READ,
                "parts, after = text.split('\\n'), int(args['insert_line'])",
                "lines = [part + '\\n' for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])",
                "if after < 0 or after > len(lines):",
                "    fail(f'insert_line {after} is not within [0, {len(lines)}]')",
                "new = [line + '\\n' for line in args['new_str'].split('\\n')]",
                "text = ''.join(lines[:after] + new + lines[after:])"]
    else:
        raise UnreplayableCall(f"file_editor {command!r} has no exact replay (the editor's history is not kept)")
    return ExactCall(exact_script(*head, *body, _WRITE)), cwd


# The editor reads a file with universal newlines in the encoding it detects, and writes UTF-8 through a
# temporary file beside it (keeping the mode bits). Only UTF-8 text is replayed: anything else is refused.
_READ = "\n".join([
    "with open(path, 'rb') as f:",
    "    raw = f.read()",
    "try:",
    "    raw.decode('utf-8')",
    "except UnicodeDecodeError:",
    "    refuse(f'{path} is not UTF-8 text: the editor would detect its encoding')",
    "if raw.startswith(b'\\xef\\xbb\\xbf'):",
    "    refuse(f'{path} starts with a byte-order mark')",
    "with open(path, encoding='utf-8') as f:",
    "    text = ''.join(f)"])
_WRITE = "\n".join([
    "mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o600",
    "with open(path, 'w', encoding='utf-8') as f:",
    "    f.write(text)",
    "os.chmod(path, mode)"])
