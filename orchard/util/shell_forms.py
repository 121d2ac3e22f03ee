"""Every neutral action (orchard/core/actions.py) as one bash command that does the same thing, for the
harnesses whose tools cannot express it (a harness with only a shell writes all its file actions so):

| action  | the command                                                                                    |
|---------|------------------------------------------------------------------------------------------------|
| Shell   | the command                                                                                    |
| View    | `cat -n PATH` (lines numbered as react's `view` numbers them), `... | sed -n 'A,Bp'` for a range; |
|         | a directory: `echo PATH && find PATH ... | sort`, as react's `view` lists it                  |
| Create  | a quoted heredoc into the file (`truncate -s -1` when the content has no final newline);       |
|         | appending: a python3 script (text without a final newline stays exact)                         |
| Replace | a python3 script replacing the one exact occurrence, failing otherwise                        |
| Edits   | a python3 script applying each edit in turn, failing when nothing changed                      |
| Insert  | a python3 script inserting the lines after line N                                             |
| Submit  | `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (the submit convention of the oracle and of        |
|         | harnesses without a submit tool)                                                              |
| McpCall | `/tmp/.orchard-mcp/mcp-call SERVER TOOL '<arguments>'`, the MCP client every sandbox of a task   |
|         | with MCP servers has (orchard/harnesses/mcp/install.py)                                       |

The scripts read and write bytes as they are (no newline translation, undecodable bytes kept)."""

from __future__ import annotations

import posixpath
import shlex

from orchard.core.actions import Action, Create, Edits, Insert, McpCall, Replace, Shell, Submit, View
from orchard.core.task import MCP_CALL_PATH

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# a directory's listing: its entries two levels deep, hidden ones pruned below it
LIST_COMMAND = "echo {path} && find {path} -mindepth 1 -maxdepth 2 -name '.*' -prune -o -print | sort"

_READ = ("with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:\n"
         "    text = f.read()")
_WRITE = ("with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:\n"
          "    f.write(text)")


def shell_command(action: Action) -> str:
    """The action as one bash command that does what it says (see the module docstring)."""
    if isinstance(action, Shell):
        return action.command
    if isinstance(action, Submit):
        return SUBMIT_COMMAND
    if isinstance(action, McpCall):
        return f"{MCP_CALL_PATH} {shlex.quote(action.server)} {shlex.quote(action.tool)} {shlex.quote(action.arguments)}"
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
            return python_script(f"path, text = {action.path!r}, {action.content!r}",
                                 "with open(path, 'a', encoding='utf-8', errors='surrogateescape', newline='') as f:",
                                 "    f.write(text)")
        delimiter = heredoc_delimiter(action.content)
        body = action.content if action.content.endswith("\n") else action.content + "\n"
        trim = "" if action.content.endswith("\n") or not action.content else f" && truncate -s -1 {path}"
        directory = posixpath.dirname(action.path)
        mkdir = f"mkdir -p {shlex.quote(directory)} && " if directory else ""
        if not action.content:
            return f"{mkdir}: > {path}"
        return f"{mkdir}cat > {path} <<'{delimiter}'{trim}\n{body}{delimiter}"
    if isinstance(action, Edits):
        return python_script(f"path, edits = {action.path!r}, {list(action.edits)!r}", _READ,
                             "before = text",
                             "for old, new, every in edits:",
                             "    text = text.replace(old, new) if every else text.replace(old, new, 1)",
                             "if text == before:",
                             "    sys.exit('No replacements were made. The old string was not found in the file.')",
                             _WRITE, "print(f'Edited {path}')")
    if isinstance(action, Insert):
        return python_script(f"path, after, new = {action.path!r}, {action.line!r}, {action.text!r}", _READ,
                             "parts = text.split('\\n')",
                             "lines = [part + '\\n' for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])",
                             "if not 0 <= after <= len(lines):",
                             "    sys.exit(f'insert_line {after} is not within [0, {len(lines)}]')",
                             "text = ''.join(lines[:after] + [line + '\\n' for line in new.split('\\n')]"
                             " + lines[after:])",
                             _WRITE, "print(f'Edited {path}')")
    return _replace_script(action)


def heredoc_delimiter(content: str) -> str:
    """A heredoc delimiter that is not a line of `content`."""
    lines = set(content.splitlines())
    delimiter = "EOF"
    while delimiter in lines:
        delimiter += "_X"
    return delimiter


def python_script(*lines: str) -> str:
    """`lines` (after `import sys`) as a python3 script in a quoted heredoc."""
    script = "\n".join(["import sys", *lines])
    delimiter = heredoc_delimiter(script)
    return f"python3 - <<'{delimiter}'\n{script}\n{delimiter}"


def _replace_script(action: Replace) -> str:
    """A python3 script that replaces the one exact occurrence of `old` (bytes as they are: no newline
    translation) and fails, changing nothing, when there is none or more than one."""
    return python_script(
        f"path, old, new = {action.path!r}, {action.old!r}, {action.new!r}",
        _READ,
        "count = text.count(old)",
        "if count != 1:",
        "    sys.exit(f'old text occurs {count} times in {path}; nothing replaced')",
        "with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:",
        "    f.write(text.replace(old, new, 1))",
        "print(f'Edited {path}')")
