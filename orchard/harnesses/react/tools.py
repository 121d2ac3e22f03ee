"""The ReAct harness's tools (bash, view, create, str_replace, submit): their OpenAI schemas and how each
runs through the Sandbox protocol, in the task's workdir.

A mistake the model can fix (bad arguments, a missing file, an ambiguous `old_str`, a read-only path)
comes back to it as the tool's output, starting with `Error:`: the sandbox's agent answered, so the
sandbox works. A failing sandbox (lost, unreachable, or any failure to run a command) raises
SandboxCallFailed: that rollout is an error, not a failed attempt."""

from __future__ import annotations

import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchard.core.errors import (AuthError, BackendError, NotFound, OrchardError, SandboxLost, SandboxNotFound,
                                 describe_validation_errors)
from orchard.core.sandbox import ExecResult, Sandbox
from orchard.harnesses.shell_command import shell_argv

# Errors that mean the sandbox itself is gone or unusable, whatever the model asked.
SANDBOX_FAILURES = (SandboxLost, SandboxNotFound, AuthError, BackendError)
SNIPPET_CONTEXT_LINES = 4
MAX_FILE_BYTES = 2_000_000  # view / str_replace read whole files; bigger ones are for bash (head, sed, grep)
MAX_LISTED_ENTRIES = 500


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOL_DEFINITIONS: list[dict[str, Any]] = [
    _function("bash", "Run a shell command (bash) in the repository directory. Each call starts a fresh "
              "shell; stdout and stderr are returned together with the exit code.",
              {"command": {"type": "string", "description": "the command line"},
               "timeout": {"type": "number", "description": "seconds before the command is killed"}},
              ["command"]),
    _function("view", "Show a file with line numbers, or list a directory two levels deep (hidden entries "
              "left out). Relative paths are under the repository directory.",
              {"path": {"type": "string"},
               "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
                              "description": "[first, last] line to show, 1-based; last -1 means the end"}},
              ["path"]),
    _function("create", "Write a file with the given content, creating parent directories; an existing file "
              "is overwritten.",
              {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    _function("str_replace", "Replace `old_str` with `new_str` in a file. `old_str` must occur exactly once: "
              "copy it from the file, whitespace included, with enough context to be unique.",
              {"path": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"}},
              ["path", "old_str", "new_str"]),
    _function("submit", "Finish the task. Call it once, when the change is complete and tested; nothing runs "
              "after it.",
              {"summary": {"type": "string", "description": "optional: what was changed"}}, []),
]
TOOL_NAMES = frozenset(tool["function"]["name"] for tool in TOOL_DEFINITIONS)


class ToolError(Exception):
    """A problem the model can fix; its message becomes the tool's output."""


class SandboxCallFailed(Exception):
    """The sandbox failed under a tool call: the run ends as an error."""


class ToolResult(BaseModel):
    content: str
    submitted: bool = False
    is_error: bool = False
    images: list[tuple[str, bytes]] = []  # (media type, bytes): an MCP tool's images, recorded beside the text


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BashArgs(_Args):
    command: str = Field(min_length=1)
    timeout: float | None = Field(default=None, gt=0)


class ViewArgs(_Args):
    path: str = Field(min_length=1)
    view_range: list[int] | None = Field(default=None, min_length=2, max_length=2)


class CreateArgs(_Args):
    path: str = Field(min_length=1)
    content: str


class StrReplaceArgs(_Args):
    path: str = Field(min_length=1)
    old_str: str
    new_str: str

    @field_validator("old_str")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("old_str is empty; give the exact text to replace")
        return value


class SubmitArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")  # models like to add a note; submitting must not fail on it
    summary: str | None = None


ARGUMENT_MODELS: dict[str, type[BaseModel]] = {
    "bash": BashArgs, "view": ViewArgs, "create": CreateArgs, "str_replace": StrReplaceArgs, "submit": SubmitArgs}


class SandboxTools:
    """Runs tool calls in `sandbox`; relative paths are resolved against `workdir`."""

    def __init__(self, sandbox: Sandbox, workdir: str, *, command_timeout_s: float) -> None:
        self.sandbox = sandbox
        self.workdir = workdir
        self.command_timeout_s = command_timeout_s

    async def call(self, name: str, arguments: dict[str, Any], *, time_left_s: float | None = None) -> ToolResult:
        """Run one tool call. Only sandbox failures raise."""
        model = ARGUMENT_MODELS.get(name)
        if model is None:
            return ToolResult(content=f"Error: there is no tool {name!r}; the tools are "
                                      f"{', '.join(sorted(TOOL_NAMES))}", is_error=True)
        try:
            args = model.model_validate(arguments)
        except ValidationError as exc:
            problems = describe_validation_errors(exc, "arguments")
            return ToolResult(content=f"Error: invalid arguments for {name}: {problems}", is_error=True)
        try:
            if isinstance(args, SubmitArgs):
                return ToolResult(content="Submitted.", submitted=True)
            if isinstance(args, BashArgs):
                return ToolResult(content=await self.bash(args, time_left_s))
            if isinstance(args, ViewArgs):
                return ToolResult(content=await self.view(args))
            if isinstance(args, CreateArgs):
                return ToolResult(content=await self.create(args))
            return ToolResult(content=await self.str_replace(args))
        except ToolError as exc:
            return ToolResult(content=f"Error: {exc}", is_error=True)
        except SANDBOX_FAILURES as exc:
            raise SandboxCallFailed(f"sandbox failed: {exc}") from exc
        except OrchardError as exc:  # the sandbox's agent answered a file operation with an error
            return ToolResult(content=f"Error: {exc}", is_error=True)

    def resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def bash(self, args: BashArgs, time_left_s: float | None) -> str:
        timeout = min(args.timeout or self.command_timeout_s, self.command_timeout_s)
        if time_left_s is not None:
            timeout = max(1.0, min(timeout, time_left_s))
        result = await self._exec(shell_argv(args.command), timeout)
        output = result.stdout + result.stderr
        if result.timed_out:
            return f"{output}\n[the command timed out after {timeout:g} s and was killed]"
        truncated = " (output truncated by the sandbox)" if result.stdout_truncated or result.stderr_truncated else ""
        return f"[exit code {result.exit_code}{truncated}]\n{output}"

    async def _exec(self, argv: list[str], timeout: float) -> ExecResult:
        """A command must run in a working sandbox: any failure here is the sandbox's."""
        try:
            return await self.sandbox.exec(argv, cwd=self.workdir, timeout=timeout)
        except OrchardError as exc:
            raise SandboxCallFailed(f"sandbox failed: {exc}") from exc

    async def _read_text(self, path: str) -> str:
        info = await self.sandbox.stat(path)
        if info.is_dir:
            raise ToolError(f"{path} is a directory; give a file path")
        if info.size > MAX_FILE_BYTES:
            raise ToolError(f"{path} has {info.size} bytes, too many to show whole; use bash (grep -n, sed -n "
                            "'FIRST,LASTp') to read parts of it")
        return _decode(await self.sandbox.read_file(path), path)

    async def view(self, args: ViewArgs) -> str:
        path = self.resolve(args.path)
        if (await self.sandbox.stat(path)).is_dir:
            if args.view_range is not None:
                raise ToolError(f"{path} is a directory; view_range only applies to files")
            return await self._list(path)
        lines = (await self._read_text(path)).splitlines()
        first, last = 1, len(lines)
        if args.view_range is not None:
            first, last = args.view_range
            last = len(lines) if last == -1 else last
            if not 1 <= first <= max(len(lines), 1) or last < first:
                raise ToolError(f"view_range {args.view_range} does not fit {path}, which has {len(lines)} lines; "
                                "use [first, last] with 1 <= first <= last, or last = -1 for the end")
            last = min(last, len(lines))
        return _numbered(lines[first - 1:last], first) or f"{path} is empty"

    async def _list(self, path: str) -> str:
        # hidden entries (.git, caches) are pruned below `path`, not `path` itself: `view .github` lists it
        result = await self._exec(["find", path, "-mindepth", "1", "-maxdepth", "2", "-name", ".*", "-prune",
                                   "-o", "-print"], 30)
        if result.exit_code != 0:
            raise ToolError(f"cannot list {path}: {result.stderr.strip() or 'find failed'}")
        entries = [path, *sorted(result.stdout.splitlines())]
        more = len(entries) - MAX_LISTED_ENTRIES
        listing = "\n".join(entries[:MAX_LISTED_ENTRIES])
        return listing + (f"\n[... {more} more entries; view a subdirectory]" if more > 0 else "")

    async def create(self, args: CreateArgs) -> str:
        path = self.resolve(args.path)
        try:
            existed = not (await self.sandbox.stat(path)).is_dir
        except NotFound:
            existed = False
        else:
            if not existed:
                raise ToolError(f"{path} is a directory; give a file path")
        await self.sandbox.write_file(path, args.content)
        lines = len(args.content.splitlines())
        return f"{'Overwrote' if existed else 'Created'} {path} ({lines} lines)."

    async def str_replace(self, args: StrReplaceArgs) -> str:
        path = self.resolve(args.path)
        text = await self._read_text(path)
        count = text.count(args.old_str)
        if count == 0:
            raise ToolError(f"old_str was not found in {path}; view the file and copy the text exactly, "
                            "including indentation and line breaks")
        if count > 1:
            starts = _occurrence_lines(text, args.old_str)
            raise ToolError(f"old_str occurs {count} times in {path} (at lines {', '.join(map(str, starts))}); "
                            "include more surrounding lines so that it is unique")
        if args.old_str == args.new_str:
            raise ToolError("old_str and new_str are the same; nothing would change")
        start_line = text[:text.index(args.old_str)].count("\n") + 1
        updated = text.replace(args.old_str, args.new_str, 1)
        await self.sandbox.write_file(path, updated)
        lines = updated.splitlines()
        first = max(1, start_line - SNIPPET_CONTEXT_LINES)
        last = min(len(lines), start_line + args.new_str.count("\n") + SNIPPET_CONTEXT_LINES)
        return f"Edited {path}. Lines {first}-{last} now read:\n{_numbered(lines[first - 1:last], first)}"


def _decode(data: bytes, path: str) -> str:
    if b"\x00" in data[:8192]:
        raise ToolError(f"{path} is a binary file ({len(data)} bytes); inspect it with bash instead")
    return data.decode("utf-8", errors="replace")


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{number:6}\t{line}" for number, line in enumerate(lines, start=first))


def _occurrence_lines(text: str, needle: str) -> list[int]:
    lines, position = [], text.find(needle)
    while position != -1:
        lines.append(text[:position].count("\n") + 1)
        position = text.find(needle, position + len(needle))
    return lines


def truncate_middle(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its head and tail around a marker saying how much
    was left out: the start of an output says what ran, its end how it finished."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters elided: narrow the command (grep, head, tail, sed -n) to see them ...]\n"
    keep = max(0, limit - len(marker.format(len(text))))
    head = keep // 2
    tail = keep - head
    return text[:head] + marker.format(len(text) - head - tail) + (text[-tail:] if tail else "")
