"""The fenced code blocks of a doc page, each preceded by a `<!-- doc-test: KIND [ARGUMENT] -->` marker that
says how a test checks it (a block without one fails the test: every example in the docs is checked)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

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
    each `pip install -e DIR` names a directory of the repository."""
    from orchard.cli.main import app

    runner = CliRunner()
    for _, code, line in of_kind(doc, "cli"):
        for text in code.splitlines():
            words = shlex.split(text, comments=True)
            if words[:1] == ["orchard"]:
                args = words[1:words.index("--")] if "--" in words else words[1:]  # what follows `--` is a command
                result = runner.invoke(app, [*args, "--help"])
                assert result.exit_code == 0, f"{doc.name}:{line}: {text!r}: {result.output}"
            elif words[:3] == ["pip", "install", "-e"]:
                assert (ROOT / words[3] / "pyproject.toml").is_file(), f"{doc.name}:{line}: {text!r}"
            else:
                assert not words, f"{doc.name}:{line}: {text!r} is neither an orchard nor a pip command"


def check_in_file_blocks(doc: Path) -> None:
    for path, code, line in of_kind(doc, "in-file"):
        assert code.strip() in (ROOT / path).read_text(), f"{doc.name}:{line} is not in {path}"
