"""A test double of a sandbox (modelled on SWE-ReX's dummy runtime): `MemorySandbox` speaks the `Sandbox`
protocol (orchard/core/sandbox.py) against files held in a dict, answers commands from a table or a function
the test gives it, and records every call. It runs nothing: it is for harness unit tests where what matters
is what the harness asks of its sandbox and how it reads the answers, not what a command would do (those
tests use a real sandbox). Nothing in Orchard's production code paths uses it.

    sandbox = MemorySandbox(files={"README.md": "hi"}, answers={"python -m pytest -q": ExecResult(exit_code=1)})
    await sandbox.exec("cat README.md")   # stdout "hi": a few commands are answered from the files
    sandbox.commands                      # ["cat README.md"]
    sandbox.lose("the node went away")    # every later call raises SandboxLost, as a lost sandbox's do

A command is answered, in order, by `answers` (the exact command; an argv list is matched as `shlex.join`
writes it), by `answer` (a function from the `ExecRequest` to an `ExecResult` or stdout text, or None to
pass), then by the few commands it can honestly answer from its files (`echo`, `cat`, `ls`, `pwd`, `true`,
`false`, with plain arguments and no shell syntax). Anything else exits 127, its stderr saying that no
answer was scripted: the double never pretends to have run a command."""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from orchard.core.errors import InvalidRequest, NotFound, PayloadTooLarge, PortClosed, SandboxLost
from orchard.core.sandbox import (DOWNLOAD_MAX_BYTES, READ_FILE_MAX_BYTES, ExecEvent, ExecRequest, ExecResult, FileInfo,
                                  SessionResult)

Answer = ExecResult | str
Answerer = Callable[[ExecRequest], Answer | None]
SHELL_SYNTAX = set("|&;<>()$`\\\"'*?[]{}~#=\n")
NOT_SCRIPTED = 127


class SandboxCall(BaseModel):
    """One call a harness made: the protocol method and its arguments."""

    method: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class MemorySandbox:
    """A `Sandbox` in memory (a test double: nothing runs). `files` maps paths (relative ones are under
    `workdir`) to their content; directories are implied by the files under them and by `directories`."""

    def __init__(self, files: dict[str, bytes | str] | None = None, *, answers: dict[str, Answer] | None = None,
                 answer: Answerer | None = None, workdir: str = "/workspace", sandbox_id: str = "memory-sandbox",
                 directories: list[str] | None = None) -> None:
        self.id = sandbox_id
        self.workdir = workdir
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.directories: set[str] = {"/", workdir}
        self.answers = dict(answers or {})
        self.answer = answer
        self.calls: list[SandboxCall] = []
        self.closed = False
        self._lost: str | None = None
        for path, data in (files or {}).items():
            self._put(self.path(path), data, None)
        for directory in directories or []:
            self._add_directory(self.path(directory))

    # --- what a test reads or changes --------------------------------------------------------------

    @property
    def commands(self) -> list[str | list[str]]:
        """Every command exec'd or streamed, in order."""
        return [call.arguments["command"] for call in self.calls if call.method in ("exec", "exec_stream")]

    def lose(self, reason: str = "the sandbox's agent is gone") -> None:
        """From now on every call raises `SandboxLost`, as a sandbox whose agent died does."""
        self._lost = reason

    def path(self, path: str) -> str:
        """`path` as an absolute, normalized path in the sandbox."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    # --- the Sandbox protocol ----------------------------------------------------------------------

    async def exec(self, command: str | list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
                   stdin: str | None = None, timeout: float | None = None,
                   max_output_bytes: int | None = None) -> ExecResult:
        self._record("exec", command=command, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                     max_output_bytes=max_output_bytes)
        request = ExecRequest(command=command, cwd=cwd, env=env or {}, stdin=stdin, timeout=timeout,
                              **({"max_output_bytes": max_output_bytes} if max_output_bytes else {}))
        return _capped(self._answer(request), request.max_output_bytes)

    async def exec_stream(self, command: str | list[str], *, cwd: str | None = None,
                          env: dict[str, str] | None = None, timeout: float | None = None
                          ) -> AsyncIterator[ExecEvent]:
        self._record("exec_stream", command=command, cwd=cwd, env=env, timeout=timeout)
        result = self._answer(ExecRequest(command=command, cwd=cwd, env=env or {}, timeout=timeout))
        for kind, data in (("stdout", result.stdout), ("stderr", result.stderr)):
            if data:
                yield ExecEvent(kind=kind, data=data)
        yield ExecEvent(kind="exit", result=result)

    async def read_file(self, path: str, *, max_bytes: int = READ_FILE_MAX_BYTES) -> bytes:
        self._record("read_file", path=path, max_bytes=max_bytes)
        data = self.files.get(self.path(path))
        if data is None:
            raise NotFound(f"{self.path(path)} does not exist in memory sandbox {self.id}")
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"{self.path(path)} is {len(data)} bytes, over the {max_bytes} asked for")
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._record("write_file", path=path, size=len(data), mode=mode)
        self._put(self.path(path), data, mode)

    async def stat(self, path: str) -> FileInfo:
        self._record("stat", path=path)
        return self._info(self.path(path))

    async def list_dir(self, path: str) -> list[FileInfo]:
        self._record("list_dir", path=path)
        directory = self.path(path)
        if directory not in self.directories:
            raise NotFound(f"{directory} is not a directory in memory sandbox {self.id}")
        return [self._info(child) for child in self._children(directory)]

    async def upload(self, local_path: str | Path, remote_path: str) -> None:
        self._record("upload", local_path=str(local_path), remote_path=remote_path)
        local, remote = Path(local_path), self.path(remote_path)
        if local.is_dir():
            self._add_directory(remote)
            for item in sorted(local.rglob("*")):
                target = posixpath.join(remote, item.relative_to(local).as_posix())
                if item.is_dir():
                    self._add_directory(target)
                else:
                    self._put(target, item.read_bytes(), item.stat().st_mode & 0o7777)
        else:
            self._put(remote, local.read_bytes(), local.stat().st_mode & 0o7777)

    async def download(self, remote_path: str, local_path: str | Path, *, max_bytes: int = DOWNLOAD_MAX_BYTES) -> None:
        self._record("download", remote_path=remote_path, local_path=str(local_path), max_bytes=max_bytes)
        remote, local = self.path(remote_path), Path(local_path)
        if remote in self.files:
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(self.files[remote])
            return
        if remote not in self.directories:
            raise NotFound(f"{remote} does not exist in memory sandbox {self.id}")
        prefix = remote.rstrip("/") + "/"
        for path, data in self.files.items():
            if path.startswith(prefix):
                target = local / path[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        local.mkdir(parents=True, exist_ok=True)

    async def shell(self, name: str = "default", *, cwd: str | None = None,
                    env: dict[str, str] | None = None) -> MemoryShellSession:
        self._record("shell", name=name, cwd=cwd, env=env)
        return MemoryShellSession(self, name, cwd, env)

    async def cpu_seconds(self) -> float | None:
        self._record("cpu_seconds")
        return None  # nothing runs, so nothing is measured

    async def start_service(self, service):
        self._record("start_service", name=service.name)
        raise InvalidRequest(f"the in-memory sandbox {self.id} runs nothing, so it runs no service")

    async def services(self) -> list:
        self._record("services")
        return []

    async def wait_services(self, names=None, *, timeout=30.0) -> list:
        self._record("wait_services", names=names)
        if names:
            raise InvalidRequest(f"the in-memory sandbox {self.id} runs nothing, so it runs no service")
        return []

    async def exec_as_service(self, command, *, env=None, timeout=None):
        self._record("exec_as_service", command=command)
        raise InvalidRequest(f"the in-memory sandbox {self.id} runs nothing, so it runs no service")

    async def attach(self, command, *, cwd=None, env=None, timeout=None):
        self._record("attach", command=command)
        raise InvalidRequest(f"the in-memory sandbox {self.id} runs nothing, so nothing can be attached to")

    async def listening_ports(self) -> list[int]:
        self._record("listening_ports")
        return []  # nothing runs, so nothing listens

    async def wait_for_port(self, port: int, *, timeout: float = 30.0) -> None:
        self._record("wait_for_port", port=port)
        raise PortClosed(f"port {port} of the in-memory sandbox {self.id}: nothing runs in it, so nothing listens")

    async def open_port(self, port: int):
        self._record("open_port", port=port)
        raise PortClosed(f"port {port} of the in-memory sandbox {self.id}: nothing runs in it, so nothing listens")

    def forward_port(self, port: int, *, host: str = "127.0.0.1", local_port: int = 0):
        self._record("forward_port", port=port)
        raise PortClosed(f"port {port} of the in-memory sandbox {self.id}: nothing runs in it, so nothing listens")

    async def close(self) -> None:
        self.calls.append(SandboxCall(method="close"))
        self.closed = True

    # --- answers -----------------------------------------------------------------------------------

    def _answer(self, request: ExecRequest) -> ExecResult:
        started = time.monotonic()
        text = request.command if isinstance(request.command, str) else shlex.join(request.command)
        given: Answer | None = self.answers.get(text)
        if given is None and self.answer is not None:
            given = self.answer(request)
        if given is None:
            given = self._builtin(request, text)
        if isinstance(given, str):
            given = ExecResult(exit_code=0, stdout=given)
        return given.model_copy(update={"duration_s": given.duration_s or time.monotonic() - started})

    def _builtin(self, request: ExecRequest, text: str) -> ExecResult:
        argv = request.command if isinstance(request.command, list) else None
        if argv is None and not SHELL_SYNTAX.intersection(text):
            argv = text.split()
        program, args = (argv[0], argv[1:]) if argv else ("", [])
        cwd = self.path(request.cwd) if request.cwd else self.workdir
        if program in ("true", "false") and not args:
            return ExecResult(exit_code=0 if program == "true" else 1)
        if program == "pwd" and not args:
            return ExecResult(exit_code=0, stdout=cwd + "\n")
        if program == "echo":
            return ExecResult(exit_code=0, stdout=" ".join(args) + "\n")
        if program == "cat" and args:
            return self._cat(cwd, args)
        if program == "ls" and len(args) <= 1:
            return self._ls(cwd, args[0] if args else ".")
        return ExecResult(exit_code=NOT_SCRIPTED, stderr=f"memory sandbox: no answer scripted for {text!r} (give "
                                                          "it in `answers` or `answer`; nothing was run)\n")

    def _cat(self, cwd: str, names: list[str]) -> ExecResult:
        out, errors = b"", ""
        for name in names:
            path = posixpath.normpath(posixpath.join(cwd, name))
            if path in self.files:
                out += self.files[path]
            else:
                errors += f"cat: {name}: {'Is a directory' if path in self.directories else 'No such file or directory'}\n"
        return ExecResult(exit_code=1 if errors else 0, stdout=out.decode(errors="replace"), stderr=errors)

    def _ls(self, cwd: str, name: str) -> ExecResult:
        path = posixpath.normpath(posixpath.join(cwd, name))
        if path in self.files:
            return ExecResult(exit_code=0, stdout=name + "\n")
        if path not in self.directories:
            return ExecResult(exit_code=2, stderr=f"ls: cannot access '{name}': No such file or directory\n")
        return ExecResult(exit_code=0, stdout="".join(posixpath.basename(child) + "\n"
                                                      for child in self._children(path)))

    # --- the in-memory filesystem ------------------------------------------------------------------

    def _record(self, method: str, **arguments: Any) -> None:
        self.calls.append(SandboxCall(method=method, arguments=arguments))
        if self._lost is not None:
            raise SandboxLost(f"sandbox {self.id} is lost: {self._lost}")
        if self.closed:
            raise SandboxLost(f"sandbox {self.id} was closed")

    def _put(self, path: str, data: bytes | str, mode: int | None) -> None:
        if path in self.directories:
            raise InvalidRequest(f"{path} is a directory in memory sandbox {self.id}")
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)
        self.modes[path] = mode if mode is not None else self.modes.get(path, 0o644)
        self._add_directory(posixpath.dirname(path))

    def _add_directory(self, path: str) -> None:
        while path not in self.directories:
            self.directories.add(path)
            path = posixpath.dirname(path)

    def _children(self, directory: str) -> list[str]:
        return sorted(path for path in self.files.keys() | self.directories
                      if path != directory and posixpath.dirname(path) == directory)

    def _info(self, path: str) -> FileInfo:
        name = posixpath.basename(path) or "/"
        if path in self.files:
            return FileInfo(path=path, name=name, size=len(self.files[path]), mode=self.modes[path])
        if path in self.directories:
            return FileInfo(path=path, name=name, is_dir=True, mode=0o755)
        raise NotFound(f"{path} does not exist in memory sandbox {self.id}")


class MemoryShellSession:
    """A shell session of a `MemorySandbox`: each command is answered as an exec (stdout and stderr
    joined); a `cd` or an export is not kept, since nothing runs."""

    def __init__(self, sandbox: MemorySandbox, name: str, cwd: str | None, env: dict[str, str] | None) -> None:
        self.sandbox, self.name, self.cwd, self.env = sandbox, name, cwd, env

    async def run(self, command: str, *, timeout: float | None = None) -> SessionResult:
        result = await self.sandbox.exec(command, cwd=self.cwd, env=self.env, timeout=timeout)
        return SessionResult(output=result.output, exit_code=result.exit_code, timed_out=result.timed_out,
                             truncated=result.stdout_truncated or result.stderr_truncated,
                             duration_s=result.duration_s)

    async def interrupt(self) -> None:
        self.sandbox._record("shell_interrupt", name=self.name)

    async def close(self) -> None:
        self.sandbox._record("shell_close", name=self.name)


def _capped(result: ExecResult, max_bytes: int) -> ExecResult:
    """Output over `max_bytes` per stream cut and flagged, as the agent does."""
    update: dict[str, Any] = {}
    for stream in ("stdout", "stderr"):
        data = getattr(result, stream).encode()
        if len(data) > max_bytes:
            update[stream] = data[:max_bytes].decode(errors="ignore")
            update[f"{stream}_truncated"] = True
    return result.model_copy(update=update) if update else result
