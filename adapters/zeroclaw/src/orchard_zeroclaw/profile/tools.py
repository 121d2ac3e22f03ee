"""The profile's own tools, run through the Sandbox protocol in the task's workdir (ZeroClaw's workspace), each
answering as ZeroClaw 0.8.4's does: a success is the tool's output (`(no output)` when it printed nothing), a
failure `Error: <reason>` in ZeroClaw's words, a result longer than `max_tool_result_chars` keeps two thirds
of it from the head and one third from the tail around `[... N characters truncated ...]`.

- `shell`: `sh -c COMMAND` in the workdir, at most `shell_timeout_s` (and never past the run's time); ZeroClaw
  answers a success with stdout alone and a failure with stderr (stdout when stderr is empty): the exit code
  is not shown.
- `file_read`: `N: line` lines and `[N lines total]` (or `[Lines a-b of N]` for a part); binary files and
  files that are not UTF-8 are refused.
- `file_write`: makes the parent directories, `Written N bytes to PATH`; `file_edit`: one exact occurrence,
  `Edited PATH: replaced 1 occurrence (N bytes)`, ZeroClaw's diagnostics when there is none or several.
- `glob_search`, `content_search` (grep, as ZeroClaw falls back to without ripgrep): paths relative to the
  workspace and a `Total:` line (the patterns and the formatting: text.py).
- `memory_store`, `memory_recall`, `memory_forget`: entries kept in the sandbox (MEMORY_PATH, outside the
  workdir), so a replay of the calls in a fresh sandbox finds what the run found; recall scores an entry by
  the share of the query's words it contains.
- `TodoWrite`: checks the list and counts it.

A mistake the model can fix comes back as the tool's error. A failing sandbox (lost, unreachable, any failure
to run a command) raises SandboxCallFailed: the run ends as an error, not a failed attempt."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from orchard.core.errors import AuthError, BackendError, NotFound, OrchardError, SandboxLost, SandboxNotFound
from orchard.core.sandbox import ExecResult, Sandbox

from orchard_zeroclaw.profile.config import ProfileConfig
from orchard_zeroclaw.profile.text import format_search_output, glob_regex, no_match_diagnostic

SANDBOX_FAILURES = (SandboxLost, SandboxNotFound, AuthError, BackendError)
STATE_DIR = "/tmp/.orchard-zeroclaw"
MEMORY_PATH = f"{STATE_DIR}/memory.json"
NO_OUTPUT = "(no output)"
MAX_GLOB_RESULTS = 1000
SEARCH_TIMEOUT_S = 30
MAX_FILE_BYTES = 10 * 1024 * 1024
TODO_STATUSES = ("pending", "in_progress", "completed")


class SandboxCallFailed(Exception):
    """The sandbox failed under a tool call: the run ends as a sandbox error."""


class ToolFailed(Exception):
    """A failure the model sees as `Error: <message>`."""


@dataclass(frozen=True)
class ToolAnswer:
    text: str  # what the model is shown
    ok: bool


def truncate_tool_result(output: str, max_chars: int) -> str:
    """ZeroClaw's cut of a long result: two thirds of the limit from the head, one third from the tail."""
    if max_chars <= 0 or len(output) <= max_chars:
        return output
    head = max_chars * 2 // 3
    tail = max_chars - head
    dropped = len(output) - head - tail
    return f"{output[:head]}\n\n[... {dropped} characters truncated ...]\n\n{output[len(output) - tail:]}"


def rust_lines(text: str) -> list[str]:
    """`str::lines()`: split at newlines, a trailing `\\r` dropped from each, no empty last line."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [part[:-1] if part.endswith("\r") else part for part in parts]


class ProfileTools:
    """Runs the profile's own tools (not `delegate`, not MCP tools) in `sandbox`, relative paths under `workdir`."""

    NAMES = frozenset({"shell", "file_read", "file_write", "file_edit", "glob_search", "content_search",
                       "memory_store", "memory_recall", "memory_forget", "TodoWrite"})

    def __init__(self, sandbox: Sandbox, workdir: str, config: ProfileConfig) -> None:
        self.sandbox, self.workdir, self.config = sandbox, posixpath.normpath(workdir), config

    async def call(self, name: str, arguments: dict[str, Any], *, time_left_s: float | None = None) -> ToolAnswer:
        """One call of tool `name` (one of NAMES). Only a failing sandbox raises."""
        try:
            output = await getattr(self, f"_{name.lower()}")(arguments, time_left_s)
        except ToolFailed as exc:
            return ToolAnswer(self._cut(f"Error: {exc}"), ok=False)
        except SANDBOX_FAILURES as exc:
            raise SandboxCallFailed(f"sandbox failed: {exc}") from exc
        except OrchardError as exc:  # the sandbox's agent answered a file operation with an error
            return ToolAnswer(self._cut(f"Error: {exc}"), ok=False)
        return ToolAnswer(self._cut(output or NO_OUTPUT), ok=True)

    def _cut(self, text: str) -> str:
        return truncate_tool_result(text, self.config.max_tool_result_chars)

    # --- arguments and paths -------------------------------------------------------------------------

    @staticmethod
    def _string(arguments: dict[str, Any], key: str, tool: str, *, required: bool = True) -> str | None:
        value = arguments.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise ToolFailed(f"executing {tool}: Missing '{key}' parameter")
        return value

    @staticmethod
    def _integer(arguments: dict[str, Any], key: str) -> int | None:
        value = arguments.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    def resolve(self, path: str) -> str:
        """`path` as an absolute path (relative ones under the workdir); outside the workdir refused when
        `workspace_only`."""
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        if self.config.workspace_only and not self.inside(full):
            raise ToolFailed(f"Path escapes workspace directory: {path}")
        return full

    def inside(self, full: str) -> bool:
        return full == self.workdir or full.startswith(self.workdir.rstrip("/") + "/")

    def relative(self, full: str) -> str:
        prefix = self.workdir.rstrip("/") + "/"
        return full[len(prefix):] if full.startswith(prefix) else full

    async def _exec(self, argv: list[str], timeout: float) -> ExecResult:
        try:
            return await self.sandbox.exec(argv, cwd=self.workdir, timeout=timeout)
        except OrchardError as exc:  # a command must run in a working sandbox: any failure here is the sandbox's
            raise SandboxCallFailed(f"sandbox failed: {exc}") from exc

    async def _text_of(self, full: str, path: str, *, reading: str = "Failed to read file") -> str:
        try:
            info = await self.sandbox.stat(full)
        except NotFound:
            raise ToolFailed(f"{reading}: No such file or directory (os error 2)") from None
        if info.is_dir:
            raise ToolFailed(f"{reading}: Is a directory (os error 21)")
        if info.size > MAX_FILE_BYTES:
            raise ToolFailed(f"File too large: {path} has {info.size} bytes (limit {MAX_FILE_BYTES})")
        data = await self.sandbox.read_file(full)
        if b"\x00" in data[:8192]:
            raise ToolFailed(f"{path} is a binary file; file_read reads text files only")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolFailed(f"{reading}: stream did not contain valid UTF-8") from None

    # --- the tools -----------------------------------------------------------------------------------

    async def _shell(self, arguments: dict[str, Any], time_left_s: float | None) -> str:
        command = self._string(arguments, "command", "shell")
        timeout = self.config.shell_timeout_s
        if time_left_s is not None:
            timeout = max(1.0, min(timeout, time_left_s))
        result = await self._exec(["sh", "-c", command], timeout)
        if result.timed_out:
            raise ToolFailed(f"Command timed out after {timeout:g}s and was killed")
        stdout = result.stdout + ("\n... [output truncated at 1MB]" if result.stdout_truncated else "")
        stderr = result.stderr + ("\n... [stderr truncated at 1MB]" if result.stderr_truncated else "")
        if result.exit_code == 0:
            return stdout
        raise ToolFailed(stderr or stdout)

    async def _file_read(self, arguments: dict[str, Any], _: float | None) -> str:
        path = self._string(arguments, "path", "file_read")
        lines = rust_lines(await self._text_of(self.resolve(path), path))
        total = len(lines)
        if total == 0:
            return ""
        offset = self._integer(arguments, "offset")
        start = min(max(offset or 1, 1) - 1, total)
        limit = self._integer(arguments, "limit")
        end = total if limit is None else min(start + limit, total)
        if start >= end:
            return f"[No lines in range, file has {total} lines]"
        numbered = "\n".join(f"{start + i + 1}: {line}" for i, line in enumerate(lines[start:end]))
        partial = start > 0 or end < total
        return numbered + (f"\n[Lines {start + 1}-{end} of {total}]" if partial else f"\n[{total} lines total]")

    async def _file_write(self, arguments: dict[str, Any], _: float | None) -> str:
        path = self._string(arguments, "path", "file_write")
        content = self._string(arguments, "content", "file_write")
        full = self.resolve(path)
        try:
            if (await self.sandbox.stat(full)).is_dir:
                raise ToolFailed("Failed to write file: Is a directory (os error 21)")
        except NotFound:
            pass
        data = content.encode()
        await self.sandbox.write_file(full, data)  # the sandbox's agent makes the parent directories
        return f"Written {len(data)} bytes to {path}"

    async def _file_edit(self, arguments: dict[str, Any], _: float | None) -> str:
        path = self._string(arguments, "path", "file_edit")
        old = self._string(arguments, "old_string", "file_edit")
        new = self._string(arguments, "new_string", "file_edit")
        if not old:
            raise ToolFailed("old_string must not be empty")
        full = self.resolve(path)
        text = await self._text_of(full, path)
        count = text.count(old)
        if count == 0:
            raise ToolFailed(no_match_diagnostic(text, old))
        if count > 1:
            raise ToolFailed(f"old_string matches {count} times; must match exactly once")
        updated = text.replace(old, new, 1)
        await self.sandbox.write_file(full, updated.encode())
        return f"Edited {path}: replaced 1 occurrence ({len(updated.encode())} bytes)"

    async def _glob_search(self, arguments: dict[str, Any], _: float | None) -> str:
        pattern = self._string(arguments, "pattern", "glob_search")
        if pattern.startswith("/"):
            raise ToolFailed("Absolute paths are not allowed. Use a relative glob pattern.")
        if ".." in pattern.split("/"):
            raise ToolFailed("Path traversal ('..') is not allowed in glob patterns.")
        try:
            regex = glob_regex(pattern)
        except re.error as exc:
            raise ToolFailed(f"Invalid glob pattern: {exc}") from None
        listing = await self._exec(["find", ".", "-type", "f"], SEARCH_TIMEOUT_S)
        if listing.timed_out:
            raise ToolFailed(f"Search timed out after {SEARCH_TIMEOUT_S} seconds.")
        found = sorted(line[2:] for line in listing.stdout.splitlines() if line.startswith("./")
                       and regex.fullmatch(line[2:]))
        if not found:
            return f"No files matching pattern '{pattern}' found in workspace."
        shown = found[:MAX_GLOB_RESULTS]
        text = "\n".join(shown)
        if len(found) > MAX_GLOB_RESULTS:
            text += f"\n\n[Results truncated: showing first {MAX_GLOB_RESULTS} of more matches]"
        return text + f"\n\nTotal: {len(shown)} files"

    async def _content_search(self, arguments: dict[str, Any], _: float | None) -> str:
        pattern = self._string(arguments, "pattern", "content_search")
        if not pattern:
            raise ToolFailed("Empty pattern")
        where = self._string(arguments, "path", "content_search", required=False) or "."
        mode = arguments.get("output_mode") or "content"
        if mode not in ("content", "files_with_matches", "count"):
            raise ToolFailed(f"Invalid output_mode '{mode}'. Allowed values: content, files_with_matches, count")
        full = self.resolve(where)
        try:
            await self.sandbox.stat(full)
        except NotFound:
            raise ToolFailed(f"Cannot resolve path '{where}': No such file or directory (os error 2)") from None
        argv = ["grep", "-r", "-n", "-H", "-E", "--binary-files=without-match"]
        if mode == "files_with_matches":
            argv.append("-l")
        elif mode == "count":
            argv.append("-c")
        else:
            for flag, key in (("-B", "context_before"), ("-A", "context_after")):
                if self._integer(arguments, key):
                    argv += [flag, str(self._integer(arguments, key))]
        if arguments.get("case_sensitive") is False:
            argv.append("-i")
        include = arguments.get("include")
        if isinstance(include, str) and include:
            argv += ["--include", include]
        argv += ["--", pattern, full]
        result = await self._exec(argv, SEARCH_TIMEOUT_S)
        if result.timed_out:
            raise ToolFailed(f"Search timed out after {SEARCH_TIMEOUT_S} seconds.")
        if result.exit_code not in (0, 1):
            raise ToolFailed(f"Search error: {result.stderr.strip()}")
        max_results = self._integer(arguments, "max_results") or 1000
        return format_search_output(result.stdout, self.workdir, mode, max_results)

    async def _load_memory(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(await self.sandbox.read_file(MEMORY_PATH))
        except NotFound:
            return []
        except ValueError:
            raise ToolFailed("Memory store is unreadable: its file is not JSON") from None
        return [entry for entry in data if isinstance(entry, dict)] if isinstance(data, list) else []

    async def _save_memory(self, entries: list[dict[str, Any]]) -> None:
        await self.sandbox.write_file(MEMORY_PATH, json.dumps(entries, indent=1).encode())

    async def _memory_store(self, arguments: dict[str, Any], _: float | None) -> str:
        key = self._string(arguments, "key", "memory_store")
        content = self._string(arguments, "content", "memory_store")
        category = arguments.get("category") if isinstance(arguments.get("category"), str) else "core"
        entries = [entry for entry in await self._load_memory() if entry.get("key") != key]
        sequence = max((int(entry.get("seq", 0)) for entry in entries), default=0) + 1
        entries.append({"key": key, "content": content, "category": category or "core", "seq": sequence})
        await self._save_memory(entries)
        return f"Stored memory: {key}"

    async def _memory_recall(self, arguments: dict[str, Any], _: float | None) -> str:
        query = arguments.get("query") if isinstance(arguments.get("query"), str) else ""
        limit = self._integer(arguments, "limit") or 5
        entries = sorted(await self._load_memory(), key=lambda entry: -int(entry.get("seq", 0)))
        words = [word for word in re.findall(r"\w+", query.lower())]
        if not words or query.strip() == "*":
            scored = [(entry, None) for entry in entries]
        else:
            scored = []
            for entry in entries:
                text = f"{entry.get('key', '')} {entry.get('content', '')}".lower()
                score = sum(1 for word in words if word in text) / len(words)
                if score > 0:
                    scored.append((entry, score))
            scored.sort(key=lambda pair: -pair[1])
        scored = scored[:limit]
        if not scored:
            return "No memories found."
        lines = [f"Found {len(scored)} memories:"]
        for entry, score in scored:
            shown = "" if score is None else f" [{score * 100:.0f}%]"
            lines.append(f"- [{entry.get('category', 'core')}] {entry.get('key')}: {entry.get('content')}{shown}")
        return "\n".join(lines) + "\n"

    async def _memory_forget(self, arguments: dict[str, Any], _: float | None) -> str:
        key = self._string(arguments, "key", "memory_forget")
        entries = await self._load_memory()
        kept = [entry for entry in entries if entry.get("key") != key]
        if len(kept) == len(entries):
            return f"No memory found with key: {key}"
        await self._save_memory(kept)
        return f"Forgot memory: {key}"

    async def _todowrite(self, arguments: dict[str, Any], _: float | None) -> str:
        todos = arguments.get("todos")
        if not isinstance(todos, list):
            raise ToolFailed("Missing 'todos' array")
        for position, todo in enumerate(todos):
            if not isinstance(todo, dict) or not isinstance(todo.get("content"), str) or not todo["content"].strip():
                raise ToolFailed(f"todo {position}: 'content' must be a non-empty string")
            if todo.get("status") not in TODO_STATUSES:
                raise ToolFailed(f"todo {position}: invalid status {todo.get('status')!r}; use one of "
                                 + ", ".join(TODO_STATUSES))
        done = sum(1 for todo in todos if todo["status"] == "completed")
        return f"{len(todos)} todos tracked ({done} done)"
