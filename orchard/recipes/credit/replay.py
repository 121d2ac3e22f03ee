"""Replaying a Kimi-CLI or OpenHands rollout exactly, for credit assignment: each recorded call becomes a
call of react's tools (its `bash`, run in the task's working directory) that does to the files exactly
what that harness's own tool did, or nothing where the tool changes no file. The neutral actions of
translation (orchard/recipes/translate/actions.py) are close, not exact (react's str_replace refuses a text that occurs
twice where Kimi's StrReplaceFile edits the first; the harnesses' editors read with universal newlines),
so each file tool is written here as a python3 script that repeats that tool's own steps:

Kimi-CLI:
- `Shell(command)`: the command (Kimi runs each in a fresh `bash -c` in the working directory);
- `WriteFile` (overwrite, append): a script; a relative path outside the working directory is refused, the
  parent directory must exist, the text is written as it is;
- `StrReplaceFile` (one edit or several): a script; read with universal newlines (undecodable bytes
  replaced), each edit on the first occurrence or all, an error when nothing changed;
- `ReadFile`, `Grep`, `Glob`, `SetTodoList`, `Think`: nothing (they change no file).

OpenHands:
- `terminal(command)`: `cd` into the directory the previous terminal call ended in (its result says so:
  the terminal is one shell for the whole run), then the command;
- `file_editor` create, str_replace, insert: a script; absolute paths only, create refuses an existing file,
  str_replace needs one occurrence (retried stripped), insert goes after line N; read with universal
  newlines, written as UTF-8 keeping the file's mode;
- `file_editor` view, `think`, `task_tracker`, `glob`, `grep`: nothing; `finish` ends the replay.

Anything else is refused (`UnreplayableCall`) before a sandbox starts: Kimi's `Shell` in the background and
its sub-agents, OpenHands' input to a running process, `undo_edit` (the editor's history is not kept), a
terminal call whose result does not say the directory it ended in (a command still running), and, at replay
time, an OpenHands edit of a file that is not UTF-8 text (the editor's encoding detection is not repeated).
Not carried between OpenHands terminal calls: variables exported by one (each command runs in a new
shell). A replay that ends with another diff than the run's says so (`replay_matches_record`)."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Any

from orchard.core.trajectory import Trajectory
from orchard.recipes.translate.actions import UntranslatableCall, _heredoc_delimiter

REFUSED = "ORCHARD-REPLAY-REFUSED"
REFUSED_CODE = 97
KIMI_NO_EFFECT = {"ReadFile", "Grep", "Glob", "SetTodoList", "Think"}
OPENHANDS_NO_EFFECT = {"think", "task_tracker", "glob", "grep"}
OPENHANDS_CWD = "[Current working directory: "


class UnreplayableCall(UntranslatableCall):
    """A recorded call whose effect on the files cannot be repeated exactly with react's tools."""


@dataclass(frozen=True)
class ExactCall:
    """What to run for one recorded call: a react call, or None (the call changes no file); `submits`: the
    call ended the run (OpenHands' finish)."""

    call: tuple[str, dict[str, Any]] | None
    submits: bool = False


EXACT_HARNESSES = ("kimi-cli", "openhands")


def exact_plan(trajectory: Trajectory, workdir: str) -> dict[str, ExactCall]:
    """tool_call_id -> the exact react call for every call of a Kimi-CLI or OpenHands rollout's agent steps;
    UnreplayableCall names the first call that cannot be replayed exactly."""
    harness = trajectory.agent.name
    if harness not in EXACT_HARNESSES:
        raise UnreplayableCall(f"no exact replay for harness {harness!r} (it knows {', '.join(EXACT_HARNESSES)})")
    plan: dict[str, ExactCall] = {}
    cwd = workdir
    for step in trajectory.steps:
        if step.source != "agent" or step.is_copied_context:
            continue
        results = {r.source_call_id: _text(r.content) for r in (step.observation.results if step.observation else [])}
        for call in step.tool_calls:
            where = f"{harness} call {call.tool_call_id} ({call.function_name}, step {step.step_id})"
            try:
                if harness == "kimi-cli":
                    plan[call.tool_call_id] = _kimi(call.function_name, call.arguments, workdir)
                else:
                    plan[call.tool_call_id], cwd = _openhands(call.function_name, call.arguments, cwd,
                                                              results.get(call.tool_call_id))
            except UnreplayableCall as exc:
                raise UnreplayableCall(f"{where}: {exc}") from None
            except (KeyError, TypeError, ValueError):
                raise UnreplayableCall(f"{where}: invalid arguments {call.arguments!r}") from None
    return plan


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return ""


# --- kimi-cli -------------------------------------------------------------------------------------------

def _kimi(name: str, arguments: dict[str, Any], workdir: str) -> ExactCall:
    if name in KIMI_NO_EFFECT:
        return ExactCall(None)
    if name == "Shell":
        if arguments.get("run_in_background"):
            raise UnreplayableCall("a command run in the background (its effect has no end to wait for)")
        return ExactCall(("bash", {"command": arguments["command"]}))
    if name == "WriteFile":
        mode = arguments.get("mode", "overwrite")
        return ExactCall(("bash", {"command": _script(
            f"path, content, mode, workdir = {arguments['path']!r}, {arguments['content']!r}, {mode!r}, {workdir!r}",
            _KIMI_PATH,
            "if not os.path.isdir(os.path.dirname(target)):",
            "    fail(f'`{path}` parent directory does not exist.')",
            "if mode not in ('overwrite', 'append'):",
            "    fail(f'Invalid write mode: `{mode}`.')",
            "with open(target, 'w' if mode == 'overwrite' else 'a', encoding='utf-8', newline='') as f:",
            "    f.write(content)")}))
    if name == "StrReplaceFile":
        edits = arguments["edit"] if isinstance(arguments["edit"], list) else [arguments["edit"]]
        parsed = [(e["old"], e["new"], bool(e.get("replace_all", False))) for e in edits]
        return ExactCall(("bash", {"command": _script(
            f"path, edits, workdir = {arguments['path']!r}, {parsed!r}, {workdir!r}",
            _KIMI_PATH,
            "if not os.path.exists(target):",
            "    fail(f'`{path}` does not exist.')",
            "if not os.path.isfile(target):",
            "    fail(f'`{path}` is not a file.')",
            "with open(target, encoding='utf-8', errors='replace') as f:",
            "    text = f.read()",
            "before = text",
            "for old, new, every in edits:",
            "    text = text.replace(old, new) if every else text.replace(old, new, 1)",
            "if text == before:",
            "    fail('No replacements were made. The old string was not found in the file.')",
            "with open(target, 'w', encoding='utf-8', errors='replace', newline='') as f:",
            "    f.write(text)")}))
    raise UnreplayableCall("Kimi-CLI's tool has no exact replay (its effect on the files is not repeated here)")


# Kimi resolves a path against its working directory and refuses a relative one that leaves it
_KIMI_PATH = "\n".join([
    "given = os.path.expanduser(path)",
    "target = os.path.normpath(os.path.join(workdir, given))",
    "inside = target == workdir or target.startswith(workdir.rstrip('/') + '/')",
    "if not inside and not os.path.isabs(given):",
    "    fail(f'`{path}` is not an absolute path.')"])


# --- openhands ------------------------------------------------------------------------------------------

def _openhands(name: str, arguments: dict[str, Any], cwd: str, result: str | None) -> tuple[ExactCall, str]:
    if name in OPENHANDS_NO_EFFECT:
        return ExactCall(None), cwd
    if name == "finish":
        return ExactCall(None, submits=True), cwd
    if name == "terminal":
        if arguments.get("is_input") or arguments.get("reset"):
            raise UnreplayableCall("input to a running process, or a terminal reset")
        after = (result or "").rfind(OPENHANDS_CWD)
        if after < 0:
            raise UnreplayableCall("its result does not say the directory it ended in (a command still running?)")
        line = result[after + len(OPENHANDS_CWD):].split("\n", 1)[0]
        command = f"cd {_quote(cwd)} || exit 1\n{arguments['command']}"
        return ExactCall(("bash", {"command": command})), line.rsplit("]", 1)[0]
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
        body = [_OPENHANDS_READ,
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
        body = [_OPENHANDS_READ,
                "parts, after = text.split('\\n'), int(args['insert_line'])",
                "lines = [part + '\\n' for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])",
                "if after < 0 or after > len(lines):",
                "    fail(f'insert_line {after} is not within [0, {len(lines)}]')",
                "new = [line + '\\n' for line in args['new_str'].split('\\n')]",
                "text = ''.join(lines[:after] + new + lines[after:])"]
    else:
        raise UnreplayableCall(f"file_editor {command!r} has no exact replay (the editor's history is not kept)")
    return ExactCall(("bash", {"command": _script(*head, *body, _OPENHANDS_WRITE)})), cwd


# The editor reads a file with universal newlines in the encoding it detects, and writes UTF-8 through a
# temporary file beside it (keeping the mode bits). Only UTF-8 text is replayed: anything else is refused.
_OPENHANDS_READ = "\n".join([
    "with open(path, 'rb') as f:",
    "    raw = f.read()",
    "try:",
    "    raw.decode('utf-8')",
    "except UnicodeDecodeError:",
    f"    refuse(f'{{path}} is not UTF-8 text: the editor would detect its encoding')",
    "if raw.startswith(b'\\xef\\xbb\\xbf'):",
    "    refuse(f'{path} starts with a byte-order mark')",
    "with open(path, encoding='utf-8') as f:",
    "    text = ''.join(f)"])
_OPENHANDS_WRITE = "\n".join([
    "mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o600",
    "with open(path, 'w', encoding='utf-8') as f:",
    "    f.write(text)",
    "os.chmod(path, mode)"])


def _script(*lines: str) -> str:
    script = "\n".join(["import os, re, sys",
                        "def fail(message):",
                        "    sys.exit(message)",
                        "def refuse(message):",
                        f"    print({REFUSED!r} + ': ' + message)",
                        f"    sys.exit({REFUSED_CODE})",
                        *lines])
    delimiter = _heredoc_delimiter(script)
    return f"python3 - <<'{delimiter}'\n{script}\n{delimiter}"


def _quote(path: str) -> str:
    return shlex.quote(posixpath.normpath(path))
