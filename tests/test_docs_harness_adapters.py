"""docs/harness-adapters.md is what plugin authors follow literally, so every code block in it is checked.
Each block is preceded by a `<!-- doc-test: KIND [PATH] -->` marker saying how:

- `protocol`: executed; the class it defines has the members and `run` signature of orchard's Harness;
- `run`: executed, and each coroutine function it defines is awaited with a real sandbox;
- `example-file PATH`: the block is the file's content, character for character (the file itself is
  built, installed and run by tests/test_plugin_example.py), so doc and example cannot drift;
- `in-file PATH`: the block appears in that file;
- `cli`: each `orchard ...` line parses (its options exist: run with `--help`), each `pip install -e DIR`
  names a directory of the repository."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from orchard.core import harness as harness_module
from orchard.sandbox.client import AsyncOrchard
from tests import doc_blocks

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "harness-adapters.md"


def blocks() -> list[tuple[str, str | None, str, int]]:
    return doc_blocks.blocks(DOC)


def of_kind(kind: str) -> list[tuple[str | None, str, int]]:
    return doc_blocks.of_kind(DOC, kind)


def test_every_block_has_a_known_check():
    assert {kind for kind, *_ in blocks()} <= {"protocol", "run", "example-file", "in-file", "cli"}
    assert of_kind("example-file") and of_kind("protocol") and of_kind("run") and of_kind("cli")


def test_the_example_listing_is_the_example_plugins_source():
    for path, code, line in of_kind("example-file"):
        assert code == (ROOT / path).read_text(), f"{DOC.name}:{line} differs from {path}: copy the file in"


def test_snippets_are_in_the_files_they_quote():
    doc_blocks.check_in_file_blocks(DOC)


def test_the_protocol_block_is_orchards_protocol():
    (_, code, _), = of_kind("protocol")
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    documented, real = namespace["Harness"], harness_module.Harness
    assert documented.__annotations__.keys() == real.__annotations__.keys()
    methods = {name for name, value in vars(real).items() if inspect.isfunction(value) and not name.startswith("_")}
    assert methods == {name for name, value in vars(documented).items() if inspect.isfunction(value)
                       and not name.startswith("_")}
    for name in methods:
        assert inspect.signature(getattr(documented, name)).parameters.keys() == \
            inspect.signature(getattr(real, name)).parameters.keys()


def test_cli_lines_name_real_commands_and_options():
    doc_blocks.check_cli_lines(DOC)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-home")


async def test_runnable_snippets_run_against_a_real_sandbox(home):
    snippets = of_kind("run")
    async with AsyncOrchard(home=home) as orch:
        sandbox = await orch.create(image="host", workdir="/workspace")
        try:
            for _, code, line in snippets:
                namespace: dict = {}
                exec(compile(code, f"{DOC.name}:{line}", "exec"), namespace)
                functions = [f for f in namespace.values() if inspect.iscoroutinefunction(f)]
                assert functions, f"{DOC.name}:{line} defines no async function to run"
                for function in functions:
                    await function(sandbox)
        finally:
            await sandbox.close()
