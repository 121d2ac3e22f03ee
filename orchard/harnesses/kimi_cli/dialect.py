"""Kimi-CLI's dialect (orchard/core/dialect.py): its tools as neutral actions and back, its prompt (captured: Kimi
renders it itself, with the working directory's listing and the date), its framing of tool results, and an
exact replay of its calls.

| action  | Kimi-CLI                                                                                     |
|---------|----------------------------------------------------------------------------------------------|
| Shell   | `Shell(command)`                                                                             |
| View    | `ReadFile(path, line_offset, n_lines)`; a directory: react's listing through `Shell`         |
| Create  | `WriteFile(path, content)` (append: `mode=append`) for a file known to exist or new directly |
|         | in the working directory (WriteFile needs the directory to exist); else through `Shell`      |
| Replace | `StrReplaceFile(path, edit={old, new})`                                                      |
| Edits   | `StrReplaceFile(path, edit=[...])`                                                           |
| Insert  | `Shell` with a python3 script                                                                |
| Submit  | a reply without tool calls (ends the run)                                                    |

Its Grep, Glob, SetTodoList and Agent tools have no action (`UntranslatableCall`). A tool result is a
`<system>` status part (`Command executed successfully.`, `ERROR: Command failed with exit code: N.`), then
the output.

**Replay.** Kimi's tools run inside the sandbox, so each recorded call is replayed as one bash command that
does exactly what the tool did (orchard/harnesses/exact_replay.py):
- `Shell(command)`: the command (Kimi runs each in a fresh `bash -c` in the working directory);
- `WriteFile` (overwrite, append): a script; a relative path outside the working directory is refused, the
  parent directory must exist, the text is written as it is;
- `StrReplaceFile` (one edit or several): a script; read with universal newlines (undecodable bytes
  replaced), each edit on the first occurrence or all, an error when nothing changed;
- `ReadFile`, `Grep`, `Glob`, `SetTodoList`, `Think`: nothing (they change no file).
Anything else is refused before a sandbox starts: `Shell` in the background, sub-agents (`Agent`)."""

from __future__ import annotations

import re
from typing import Any

from orchard.core.actions import (Action, Create, Edits, Replace, Shell, Submit, UnreplayableCall, UntranslatableCall,
                                  View, new_file_in_workdir)
from orchard.core.dialect import Observed, observation_text
from orchard.core.trajectory import ObservationResult, Trajectory
from orchard.harnesses.captured_dialect import CapturedPromptDialect
from orchard.harnesses.exact_replay import ExactCall, ExactReplay, exact_plan, exact_script
from orchard.util.shell_forms import shell_command

KIMI_STATUS = re.compile(r"\A<system>(ERROR: )?(.*?)</system>", re.S)
KIMI_FAILED = re.compile(r"Command failed with exit code: (-?\d+)\.")
NO_EFFECT = {"ReadFile", "Grep", "Glob", "SetTodoList", "Think"}


class KimiCliDialect(CapturedPromptDialect):
    # --- its tools ------------------------------------------------------------------------------------

    def read_call(self, name: str, arguments: dict[str, Any], result: str) -> Action:
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

    def write_call(self, action: Action, workdir: str) -> tuple[str, dict[str, Any]] | None:
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
        if isinstance(action, Create) and (action.append or action.overwrites
                                           or new_file_in_workdir(action, workdir)):
            return "WriteFile", {"path": action.path, "content": action.content,
                                 **({"mode": "append"} if action.append else {})}
        if isinstance(action, Replace):
            return "StrReplaceFile", {"path": action.path, "edit": {"old": action.old, "new": action.new}}
        if isinstance(action, Edits):
            return "StrReplaceFile", {"path": action.path, "edit": [
                {"old": old, "new": new, **({"replace_all": True} if every else {})}
                for old, new, every in action.edits]}
        return "Shell", {"command": shell_command(action)}  # a directory's listing as react's, inserts, new files

    # --- its framing of tool results -----------------------------------------------------------------

    def read_result(self, function_name: str, result: ObservationResult | None) -> Observed:
        text = observation_text(result)
        status = KIMI_STATUS.match(text)
        if status is None:
            return Observed(text, 0)
        output = text[status.end():]
        failed = KIMI_FAILED.search(status.group(2))
        if failed:
            return Observed(output, int(failed.group(1)))
        return Observed(output, 1 if status.group(1) else 0)

    def result_parts(self, function_name: str, observed: Observed) -> list[dict[str, str]]:
        if function_name == "Shell":
            status = ("Command executed successfully." if observed.returncode == 0 else
                      f"ERROR: Command failed with exit code: {observed.returncode}.")
        else:
            status = "ERROR: the tool failed." if observed.returncode else ""
        parts = [f"<system>{status}</system>"] if status else []
        parts += [observed.output] if observed.output else []
        return [{"type": "text", "text": part} for part in parts or ["<system>Tool output is empty.</system>"]]

    # --- its calls replayed ---------------------------------------------------------------------------

    def replay(self, trajectory: Trajectory, workdir: str) -> ExactReplay:
        return ExactReplay(exact_plan(trajectory, lambda name, arguments, _: exact_call(name, arguments, workdir)),
                           workdir)


def exact_call(name: str, arguments: dict[str, Any], workdir: str) -> ExactCall:
    """The bash command that does what Kimi's tool `name` did (see the module docstring)."""
    if name in NO_EFFECT:
        return ExactCall(None)
    if name == "Shell":
        if arguments.get("run_in_background"):
            raise UnreplayableCall("a command run in the background (its effect has no end to wait for)")
        return ExactCall(arguments["command"])
    if name == "WriteFile":
        mode = arguments.get("mode", "overwrite")
        return ExactCall(exact_script(
            f"path, content, mode, workdir = {arguments['path']!r}, {arguments['content']!r}, {mode!r}, {workdir!r}",
            _PATH,
            "if not os.path.isdir(os.path.dirname(target)):",
            "    fail(f'`{path}` parent directory does not exist.')",
            "if mode not in ('overwrite', 'append'):",
            "    fail(f'Invalid write mode: `{mode}`.')",
            "with open(target, 'w' if mode == 'overwrite' else 'a', encoding='utf-8', newline='') as f:",
            "    f.write(content)"))
    if name == "StrReplaceFile":
        edits = arguments["edit"] if isinstance(arguments["edit"], list) else [arguments["edit"]]
        parsed = [(e["old"], e["new"], bool(e.get("replace_all", False))) for e in edits]
        return ExactCall(exact_script(
            f"path, edits, workdir = {arguments['path']!r}, {parsed!r}, {workdir!r}",
            _PATH,
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
            "    f.write(text)"))
    raise UnreplayableCall("Kimi-CLI's tool has no exact replay (its effect on the files is not repeated here)")


# Kimi resolves a path against its working directory and refuses a relative one that leaves it
_PATH = "\n".join([
    "given = os.path.expanduser(path)",
    "target = os.path.normpath(os.path.join(workdir, given))",
    "inside = target == workdir or target.startswith(workdir.rstrip('/') + '/')",
    "if not inside and not os.path.isabs(given):",
    "    fail(f'`{path}` is not an absolute path.')"])
