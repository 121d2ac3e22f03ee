"""Every code block of README.md, run. Each is preceded by `<!-- doc-test: KIND -->`:

- `shell`: each line runs, in order, in a fresh directory with an Orchard home of its own (the zeroclaw bundle
  and the Debian image that task-dirs-mini's Harbor tasks name already there), and must succeed; an
  `orchard eval` must resolve every task it ran, and zeroclaw's with the oracle through ZeroClaw's shell tool
  (test_zeroclaw_oracle.resolved_through_shell), task-dirs-mini's MCP tools offered as ZeroClaw names them.
  Three kinds of line are checked rather than run, and say so: `pip install -e DIR` (DIR is where the installed
  package comes from: installing again would change the environment the tests run in), `python -m pytest DIR`
  (these very tests), and `export NAME=VALUE` (kept for the lines after it). `/opt/zeroclaw/bin/zeroclaw`, the
  README's ZeroClaw binary, is the STAND-IN for it (zeroclaw_standin.py): ZeroClaw cannot be built here;
- `in-file PATH`: the block appears in that file (under tests/... of this distribution).

The training block exports SmolLM2 and runs a step of SFT on the CPU (minutes): it needs the model's weights
(`model`)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import orchard_zeroclaw
import pytest
from test_zeroclaw_oracle import resolved_through_shell
from zeroclaw_rig import ADAPTER, REPOSITORY, STANDIN, debian_home, home_with_cache, orchard, trajectories

README = ADAPTER / "README.md"
BLOCK = re.compile(r"<!-- doc-test: (?P<kind>[a-z-]+)(?: (?P<path>\S+))? -->\n```[a-z]*\n(?P<code>.*?)```", re.S)
README_BINARY = "/opt/zeroclaw/bin/zeroclaw"


def blocks() -> list[tuple[str, str | None, str]]:
    return [(m.group("kind"), m.group("path"), m.group("code")) for m in BLOCK.finditer(README.read_text())]


def shell_blocks(training: bool) -> list[str]:
    return [code for kind, _, code in blocks() if kind == "shell" and ("train sft" in code) == training]


def test_every_block_is_checked():
    text = README.read_text()
    assert text.count("```") == 2 * len(blocks()), "a code block without its doc-test marker"
    assert {kind for kind, _, _ in blocks()} == {"shell", "in-file"}


def test_the_quoted_files_hold_the_blocks():
    for kind, path, code in blocks():
        if kind == "in-file":
            assert code in (ADAPTER / path).read_text(), f"README.md quotes {path}, which no longer holds it"


def run_lines(code: str, workdir: Path, home: Path) -> None:
    env: dict[str, str] = {}
    for line in filter(None, (line.strip() for line in code.splitlines())):
        words = shlex.split(line.replace(README_BINARY, str(STANDIN)))
        if words[:3] == ["pip", "install", "-e"]:
            installed = Path(orchard_zeroclaw.__file__).resolve()
            assert installed.is_relative_to((REPOSITORY / words[3]).resolve()), (installed, words[3])
            continue
        if words[:3] == ["python", "-m", "pytest"]:
            assert (REPOSITORY / words[3]).resolve() == Path(__file__).resolve().parent
            continue
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = value
            continue
        assert words[0] == "orchard", line
        ran = orchard(*words[1:], home=home, env=env, cwd=workdir, timeout=1500)
        assert ran.returncode == 0, f"{line}\n{ran.stdout}{ran.stderr}"
        if words[1] == "harness" and words[2] == "list":
            row = next(row for row in ran.stdout.splitlines() if "│ zeroclaw " in row)
            listed = r"zeroclaw +│ 0\.1\.0\+zeroclaw-profile\.0\.8\.4 +│ plugin +│ orchard-zeroclaw 0\.1\.0"
            assert re.search(listed, row), row
        if words[1] == "eval":
            assert "--out" in words, f"{line}: give each run its own --out (they would resume one another)"
            out = workdir / words[words.index("--out") + 1]
            rows = json.loads((out / "results.json").read_text())["tasks"]
            assert rows and {row["status"] for row in rows} == {"resolved"}, (line, rows)
            if words[words.index("--harness") + 1] == "zeroclaw" and words[words.index("--model") + 1] == "oracle":
                resolved_through_shell(out, len(rows))
            if "task-dirs-mini" in words:
                assert len(rows) == 6
                notes = next(t for t in trajectories(out) if t.task_id == "notes-mcp")
                assert "notes__add_note" in [tool["function"]["name"] for tool in notes.agent.tool_definitions]
            if words[words.index("--suite") + 1] == "swe-mini" and "--tasks" not in words:
                assert len(rows) == 14


@pytest.mark.slow
def test_the_run_blocks_run(tmp_path, zeroclaw_cache):
    home = debian_home(home_with_cache(tmp_path / "home", zeroclaw_cache))
    workdir = tmp_path / "work"
    workdir.mkdir()
    for code in shell_blocks(training=False):
        run_lines(code, workdir, home)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(2400)
def test_the_training_block_runs(tmp_path):
    pytest.importorskip("torch")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (training,) = shell_blocks(training=True)
    run_lines(training, workdir, tmp_path / "home")
    metrics = json.loads((workdir / "runs" / "sft-zeroclaw" / "metrics.json").read_text())
    assert metrics["data"]["examples"] == 3
