"""`orchard train sft` on Claw trajectories: rollouts of claw-mini's mail-reply-budget recorded by real runs of
the evaluator in real sandboxes with the mail service running — react with a scripted model (the stand-in for
a model only) that works through the mail service's MCP tools as react offers them (`mail__search_messages`,
`mail__reply`), and mini-swe-agent with the same model doing the same through its shell's `mcp-call` command
— both resolved by the services' state. One SFT step of the random tiny Qwen3 trains on them as they are, and
one on them translated into ZeroClaw's dialect (the orchard-zeroclaw plug-in): an MCP tool call and its result
survive into the training rows either way — react's as its function call, mini-swe-agent's as its shell
command, ZeroClaw's as the `mcp-call` command its shell runs — never dropped. The two steps are the `train sft`
lines of docs/claw.md's `claw-train` block."""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.jsonl import read_jsonl
from orchard.eval.results import TRAJECTORIES_FILE
from orchard.eval.runner import run_eval
from orchard.recipes.common.examples import IGNORE_INDEX, build_examples
from orchard.recipes.common.tiny_models import smollm2_tokenizer
from orchard.recipes.translate.trajectory import translate_trajectory
from orchard.sandbox.client import AsyncOrchard
from tests import doc_blocks
from tests.harness_rig import tool_calls
from tests.recipes.sft_rig import tiny_model_dir
from tests.recipes.test_translate import SCRIPTED, scripted_config
from tests.running_server import remove_live_sandboxes

pytestmark = pytest.mark.model  # torch

TASK = "mail-reply-budget"
REPLY = "Hi Carol, the Q2 budget is approved. Sam"
# what the model does through react's MCP tools: find the mail, reply in its thread, submit
SCRIPT = [
    tool_calls(("mail__search_messages", {"query": "Q2 budget"}), content="Let me find Carol's mail."),
    tool_calls(("mail__reply", {"message_id": "m1", "body": REPLY})),
    tool_calls(("submit", {"summary": "approved the Q2 budget"})),
]
# the same through mini-swe-agent's one tool, its shell, with the `mcp-call` command its instruction explains
MCP_CALL = "/tmp/.orchard-mcp/mcp-call"
SHELL_SCRIPT = [
    tool_calls(("bash", {"command": f"{MCP_CALL} mail search_messages '{{\"query\": \"Q2 budget\"}}'"})),
    tool_calls(("bash", {"command": f"{MCP_CALL} mail reply "
                                    f"'{json.dumps({'message_id': 'm1', 'body': REPLY})}'"})),
    tool_calls(("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})),
]
cli = CliRunner()


@pytest.fixture(scope="module")
def claw_runs(tmp_path_factory, scripted) -> tuple[Path, Path]:
    """(react's run, mini-swe-agent's run) of the task, each resolved."""
    directory = tmp_path_factory.mktemp("claw-sft")
    home = directory / "home"
    home.mkdir()

    async def record() -> None:
        async with AsyncOrchard(home=home) as orchard:
            for harness, script in (("react", SCRIPT), ("mini-swe-agent", SHELL_SCRIPT)):
                scripted.load(script)
                results = await run_eval(harness=harness, model=SCRIPTED, suite="claw-mini", task_ids=[TASK],
                                         out_dir=directory / harness, orchard_client=orchard,
                                         gateway_config=scripted_config(scripted.url))
                assert [(row.status, row.reward) for row in results.tasks] == [("resolved", 1.0)], results.tasks
    try:
        asyncio.run(record())
    finally:
        remove_live_sandboxes(home)
    return directory / "react", directory / "mini-swe-agent"


def trained_and_seen(trajectories, tokenizer) -> tuple[str, str]:
    """(what the examples train on, everything they hold), decoded."""
    report = build_examples(trajectories, tokenizer)
    assert report.examples and not report.skipped, report.skipped
    trained = "\n".join(tokenizer.decode([t for t, label in zip(e.input_ids, e.labels) if label != IGNORE_INDEX])
                        for e in report.examples)
    seen = "\n".join(tokenizer.decode(e.input_ids) for e in report.examples)
    return trained, seen


@pytest.mark.slow
def test_mcp_calls_and_results_survive_into_the_rows_as_recorded_and_translated_into_zeroclaw(claw_runs):
    tokenizer = smollm2_tokenizer()
    react_run, mini_run = claw_runs
    (react,) = read_jsonl(react_run / TRAJECTORIES_FILE)
    (mini,) = read_jsonl(mini_run / TRAJECTORIES_FILE)
    names = [call.function_name for step in react.steps for call in step.tool_calls]
    assert names == ["mail__search_messages", "mail__reply", "submit"]

    trained, seen = trained_and_seen([react], tokenizer)
    assert "mail__reply" in trained and REPLY in trained  # the model's MCP call is a trained completion
    assert "Q2 budget: approval needed" in seen  # the search's result, in the next call's prompt
    trained, seen = trained_and_seen([mini], tokenizer)
    assert "mcp-call mail reply" in trained  # the command, trained; the service's answer in the next prompt
    assert '\\"sent\\": {' in seen and '\\"subject\\": \\"Re: Q2 budget: approval needed\\"' in seen

    zeroclaw = translate_trajectory(react, "zeroclaw")
    commands = [call.arguments.get("command", "") for step in zeroclaw.steps for call in step.tool_calls]
    assert [c.split("'")[0] for c in commands] == ["/tmp/.orchard-mcp/mcp-call mail search_messages ",
                                                   "/tmp/.orchard-mcp/mcp-call mail reply "]
    assert json.loads(commands[1].split("'", 1)[1].rsplit("'", 1)[0]) == {"message_id": "m1", "body": REPLY}
    trained, seen = trained_and_seen([zeroclaw], tokenizer)
    assert "mcp-call mail reply" in trained and REPLY in trained
    assert '"subject": "Re: Q2 budget: approval needed"' in seen  # its result, as ZeroClaw's shell shows it


def documented_lines() -> list[list[str]]:
    """docs/claw.md's `claw-train` block, each line split as the shell splits it."""
    ((_, code, _),) = doc_blocks.of_kind(doc_blocks.ROOT / "docs" / "claw.md", "claw-train")
    return [shlex.split(line) for line in code.splitlines() if line.strip()]


def test_every_line_of_the_pages_training_block_parses():
    for words in documented_lines():
        doc_blocks.check_orchard_line(words, f"claw.md claw-train: {shlex.join(words)}")


@pytest.mark.slow
def test_the_pages_sft_lines_train_a_step_as_recorded_and_in_zeroclaws_dialect(claw_runs, tmp_path,
                                                                                torch_one_thread):
    """The page's `train sft` lines as written, but for paths: its runs are these, its student (the exported
    SmolLM2 of the `export-smollm2` line, which needs the model's weights) the tiny random model."""
    model = tiny_model_dir(tmp_path / "tiny")
    react_run, mini_run = claw_runs
    lines = documented_lines()
    assert lines[0][:3] == ["orchard", "train", "export-smollm2"]
    places = {"runs/xh/react-claw-mini": str(react_run), "runs/xh/mini-swe-agent-claw-mini": str(mini_run),
              lines[0][3]: str(model)}
    sft = [words for words in lines if words[1:3] == ["train", "sft"]]
    assert len(sft) == 2 and ["--target-harness", "zeroclaw"] == sft[1][-6:-4]
    for words in sft:
        out = tmp_path / words[words.index("--out") + 1]
        args = [places.get(word, word) for word in words[1:]]
        args[args.index("--out") + 1] = str(out)
        done = cli.invoke(app, args)
        assert done.exit_code == 0, done.output
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["data"]["examples"] >= 6 and [s["step"] for s in metrics["steps"]] == [1], metrics["data"]
        assert (out / "model" / "config.json").is_file()
