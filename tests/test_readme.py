"""The README's examples, as a new user runs them (markers as in tests/doc_blocks.py): the Python example
runs on the embedded default and prints what its comments say, each `orchard ...` line parses, and each
`make` target exists."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from tests import doc_blocks

README = doc_blocks.ROOT / "README.md"


def test_every_block_has_a_known_check():
    assert {kind for kind, *_ in doc_blocks.blocks(README)} == {"make", "python", "cli"}


def test_the_python_example_runs_and_prints_what_it_says(tmp_path):
    (_, code, line), = doc_blocks.of_kind(README, "python")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ORCHARD_HOME": str(tmp_path)}, cwd=tmp_path)
    assert ran.returncode == 0, f"README.md:{line}: {ran.stderr}"
    assert ran.stdout.split("\n")[:4] == ["0 42", "", "b'hello'", "/tmp"], ran.stdout
    assert ran.stdout.split("\n")[4] == "1", ran.stdout


def test_cli_lines_parse():
    doc_blocks.check_cli_lines(README)


def test_make_targets_exist():
    targets = set(re.findall(r"^([a-z][\w-]*):", (doc_blocks.ROOT / "Makefile").read_text(), re.M))
    for _, code, line in doc_blocks.of_kind(README, "make"):
        for text in code.splitlines():
            words = shlex.split(text, comments=True)
            assert words[:1] == ["make"] and set(words[1:]) <= targets, f"README.md:{line}: {text!r}"
