"""The fenced code blocks of a doc page, each preceded by a `<!-- doc-test: KIND [ARGUMENT] -->` marker that
says how a test checks it (a block without one fails the test: every example in the docs is checked; which
test module checks which page's kinds is registered in tests/test_docs_examples.py).

Besides the parser, the checks of the kinds several pages share:
- `cli`: each `orchard ...` line parses (`--help`), each `pip install` line installs what the project does;
- `shell`: each command exists (a Makefile target, a repository script and its subcommand, a module with
  the options shown, an `orchard` command, a `pip install` as above), nothing is run;
- `yaml MODEL` / `json MODEL`: the block parses and `MODEL` (a dotted path: a pydantic model, or a function
  taking the parsed data) accepts it;
- `diagram [DIR]`: an ASCII picture, not run; every file or package name in it exists in the repository
  (with DIR: is named by the files under DIR, for pictures of what those scripts make);
- `in-file PATH`: the block appears in that file."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- doc-test: (\S+)(?: (\S+))? -->$")


def blocks(doc: Path) -> list[tuple[str, str | None, str, int]]:
    """(kind, argument, code, line number) of every fenced block of the page."""
    lines = doc.read_text().split("\n")
    found, index = [], 0
    while index < len(lines):
        if re.match(r"^ {0,3}```", lines[index]):
            start = index
            end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
            marker = MARKER.match(lines[start - 1]) if start > 0 else None
            assert marker, f"{doc.name}:{start + 1}: a code block without a `<!-- doc-test: ... -->` marker"
            found.append((marker.group(1), marker.group(2), "\n".join(lines[start + 1:end]) + "\n", start + 1))
            index = end + 1
        else:
            index += 1
    return found


def of_kind(doc: Path, kind: str) -> list[tuple[str | None, str, int]]:
    return [(argument, code, line) for k, argument, code, line in blocks(doc) if k == kind]


def check_cli_lines(doc: Path) -> None:
    """Each `orchard ...` line of the page's `cli` blocks parses (its options exist: run with `--help`);
    each `pip install` line installs what the project installs (see `check_pip_line`)."""
    for _, code, line in of_kind(doc, "cli"):
        for text in code.splitlines():
            words = shlex.split(text, comments=True)
            if words[:1] == ["orchard"]:
                check_orchard_line(words, f"{doc.name}:{line}: {text!r}")
            elif words[:2] == ["pip", "install"]:
                check_pip_line(words, f"{doc.name}:{line}: {text!r}")
            else:
                assert not words, f"{doc.name}:{line}: {text!r} is neither an orchard nor a pip command"


def check_orchard_line(words: list[str], where: str) -> None:
    """`orchard ARGS...` parses: the command exists and takes the options shown (what follows `--` is a
    command of its own, `...` stands for arguments shown on another line)."""
    from orchard.cli.main import app

    args = words[1:words.index("--")] if "--" in words else words[1:]
    result = CliRunner().invoke(app, [word for word in args if word != "..."] + ["--help"])
    assert result.exit_code == 0, f"{where}: {result.output}"


def check_pip_line(words: list[str], where: str) -> None:
    """`pip install -e DIR[EXTRAS]`: DIR is a project of the repository declaring those extras;
    `pip install [--no-deps] NAME==VERSION`: the Makefile's setup installs that very pin (the same flags)."""
    args = words[2:]
    if args[:1] == ["-e"]:
        match = re.fullmatch(r"([^\[]+)(?:\[([\w,-]+)\])?", args[1])
        assert match, f"{where}: not a DIR[EXTRAS]"
        pyproject = ROOT / match.group(1) / "pyproject.toml"
        assert pyproject.is_file(), f"{where}: {match.group(1)} is not a project of the repository"
        declared = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
        for extra in filter(None, (match.group(2) or "").split(",")):
            assert extra in declared, f"{where}: {pyproject.relative_to(ROOT)} declares no extra {extra!r}"
    else:
        pins = [word for word in args if "==" in word]
        assert pins, f"{where}: install a pinned version, as the Makefile does"
        setup = [shlex.split(text.split("pip install", 1)[1]) for text in (ROOT / "Makefile").read_text().splitlines()
                 if "pip install" in text]
        assert [word for word in args if word != "-q"] in [[w for w in s if w != "-q"] for s in setup], \
            f"{where}: the Makefile's setup does not install this (its pins: {setup})"


def check_shell_lines(doc: Path) -> None:
    """Each command of the page's `shell` blocks exists; none is run (see `check_shell_line`)."""
    for _, code, line in of_kind(doc, "shell"):
        for text in re.sub(r"\\\n", " ", code).splitlines():
            check_shell_line(text, f"{doc.name}:{line}: {text.strip()!r}")


EXTERNAL_TOOLS = {"kubectl", "docker", "podman", "skopeo"}  # commands of other projects a page may show


def check_shell_line(text: str, where: str) -> None:
    """One command line: `make T` (a Makefile target), `[bash] scripts/X.sh [SUB]` (the script exists and
    has that subcommand), `python -m MOD [--opt ...]` (MOD's `--help` lists each option), `orchard ...`,
    `pip install ...`, `export NAME=...` (Orchard or its scripts read NAME), `eval "$(COMMAND)"` (COMMAND
    is checked), a leading `sudo` is dropped, or a tool of EXTERNAL_TOOLS; every repository path it names
    exists."""
    words = shlex.split(text, comments=True)
    if words[:1] == ["sudo"]:
        words = words[1:]
    if not words:
        return
    if words[0] == "eval":
        return check_shell_line(words[1].removeprefix("$(").removesuffix(")"), where)
    for word in words[1:]:  # the repository paths it names exist
        if re.fullmatch(r"(?:bench|deploy|docs|eval|orchard|scripts)/[\w./-]*", word):
            assert (ROOT / word).exists(), f"{where}: {word} is not in the repository"
    if words[0] == "make":
        targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
        assert set(words[1:]) <= targets, f"{where}: the Makefile has no target {set(words[1:]) - targets}"
    elif words[0] == "export":
        name = words[1].split("=", 1)[0]
        assert any(name in path.read_text(errors="replace") for path in _code_files()), \
            f"{where}: nothing in orchard/ or scripts/ reads {name}"
    elif words[0] == "orchard":
        check_orchard_line(words, where)
    elif words[:2] == ["pip", "install"]:
        check_pip_line(words, where)
    elif words[0] in ("python", "python3") and words[1] == "-m":
        options = set(re.findall(r"(?<![\w-])--[\w-]+", text.split("#", 1)[0]))
        assert importlib.util.find_spec(words[2]) is not None, f"{where}: no module {words[2]}"
        usage = _module_help(words[2])
        for option in options:
            assert re.search(rf"{re.escape(option)}\b", usage), f"{where}: `python -m {words[2]}` has no {option}"
    elif words[0] == "bash" or words[0].startswith("scripts/"):
        script, rest = (words[1], words[2:]) if words[0] == "bash" else (words[0], words[1:])
        assert (ROOT / script).is_file(), f"{where}: no script {script}"
        if rest and not rest[0].startswith("-"):
            assert re.search(rf"^\s*(?:[\w|-]+\|)?{re.escape(rest[0])}(?:\|[\w|-]+)?\)", (ROOT / script).read_text(),
                             re.M), f"{where}: {script} has no subcommand {rest[0]!r}"
    elif words[0] not in EXTERNAL_TOOLS:
        raise AssertionError(f"{where}: {words[0]!r} is not a command this check knows (see check_shell_line)")


@cache
def _module_help(module: str) -> str:
    ran = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**os.environ, "COLUMNS": "300"})
    assert ran.returncode == 0, f"python -m {module} --help: {ran.stderr}"
    return ran.stdout


@cache
def _code_files() -> tuple[Path, ...]:
    return tuple(path for folder in ("orchard", "scripts") for path in (ROOT / folder).rglob("*")
                 if path.is_file() and path.suffix in (".py", ".sh"))


def resolve(dotted: str) -> Any:
    """The object a dotted path names (`orchard.gateway.config.GatewayConfig`)."""
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        return getattr(resolve(module), name)


def check_data_blocks(doc: Path, kind: str) -> list[Any]:
    """Each `yaml MODEL` / `json MODEL` block parses and MODEL accepts it; returns what MODEL made of each."""
    import yaml

    made = []
    for dotted, code, line in of_kind(doc, kind):
        assert dotted, f"{doc.name}:{line}: a `{kind}` block names the model it is an instance of"
        data = yaml.safe_load(code) if kind == "yaml" else json.loads(code)
        target = resolve(dotted)
        try:
            made.append(target.model_validate(data) if hasattr(target, "model_validate") else target(data))
        except Exception as exc:
            raise AssertionError(f"{doc.name}:{line}: not a valid {dotted}: {exc}") from exc
    return made


PATH_NAME = re.compile(r"[A-Za-z_*][\w.*-]*(?:/[\w.*-]*)+|[\w*-]+\.(?:py|sh|toml|yaml|json|csv|tar|pid)\b")


def diagram_names(code: str) -> set[str]:
    """The file and package names an ASCII picture shows (`orchard/core`, `server/`, `client.py`)."""
    return set(PATH_NAME.findall(code))


def check_diagram_blocks(doc: Path) -> None:
    """In each `diagram` block, every file or package name exists in the repository (a path of a tracked
    file, or the end of one); `diagram DIR` blocks picture what the scripts under DIR make, so each name
    (and each unindented first word) is, component by component, named in those scripts."""
    tracked = _tracked_paths()
    for directory, code, line in of_kind(doc, "diagram"):
        names = diagram_names(code)
        if directory is None:
            for name in names:
                suffix = "/" + name.strip("/")
                assert any(("/" + path).endswith(suffix) for path in tracked), \
                    f"{doc.name}:{line}: {name!r} is not a file or package of the repository"
        else:
            text = "\n".join(path.read_text(errors="replace") for path in (ROOT / directory).rglob("*")
                             if path.is_file())
            names |= {words[0] for text_line in code.splitlines() if (words := text_line.split())
                      and not text_line.startswith(" ")}
            for name in names:
                for part in filter(None, name.split("/")):
                    part = part.strip("*")
                    assert part in text, f"{doc.name}:{line}: {name!r}: nothing under {directory} names {part!r}"


@cache
def _tracked_paths() -> frozenset[str]:
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    return frozenset(files) | {str(Path(f).parent) + "/" for f in files} | {str(Path(f).parent) for f in files}


def run_python(code: str, where: str, namespace: dict) -> Any:
    """Executes a `python` block in `namespace`; top-level `await` is allowed (then the coroutine to await
    is returned, else None)."""
    return eval(compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True), namespace)


def check_in_file_blocks(doc: Path) -> None:
    for path, code, line in of_kind(doc, "in-file"):
        assert code.strip() in (ROOT / path).read_text(), f"{doc.name}:{line} is not in {path}"
