"""The report's matrix per domain, on real runs: react in real sandboxes on claw-mini (the Claw world's
services), claw-bench and swe-mini, with the oracle and with a scripted model (a stand-in for the model
only) that resolves mail-reply-budget's first attempt and gives up on its second, each task two attempts
(`attempts=2`; swe-mini's one). The runs record each task's domain; `orchard report` prints, and its HTML
shows, a harness × model matrix per domain — claw pooling claw-mini's and claw-bench's tasks, swe apart —
each cell with its rate and pass@k and pass^k (here the scripted model's pass@2 100% but pass^2 0%). Also
where a task's domain comes from."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.eval.domains import domain_rows, task_domain
from orchard.eval.models import eval_gateway_config
from orchard.eval.report import load_runs
from orchard.eval.runner import run_eval
from orchard.eval.suites import load_suite
from orchard.gateway.config import GatewayConfig, ModelRoute
from orchard.sandbox.client import AsyncOrchard
from tests.harness_rig import tool_calls
from tests.running_server import remove_live_sandboxes

cli = CliRunner()
PAGEKIT = "orchard__pagekit-112"
# attempt 1 replies to the right mail and submits (resolved); attempt 2 submits at once (a no-op: 0.2)
SCRIPT = [tool_calls(("mail__reply", {"message_id": "m1", "body": "The Q2 budget is approved."})),
          tool_calls(("submit", {"summary": "approved"})),
          tool_calls(("submit", {"summary": "nothing to do"}))]


def test_a_tasks_domain_is_what_it_already_says():
    assert {task_domain(task) for task in load_suite("claw-mini").tasks} == {"claw"}
    assert task_domain(load_suite("claw-bench").get("eml-001")) == "claw"
    assert {task_domain(task) for task in load_suite("swe-mini").tasks} == {"swe"}
    by_id = {task.id: task_domain(task) for task in load_suite("task-dirs-mini").tasks}
    assert by_id == {"mini-001": "claw", "mini-003": "claw", "harbor-build": "terminal", "harbor-hello": "terminal",
                     "mail-service": "other", "notes-mcp": "other"}
    named = load_suite("swe-mini").get(PAGEKIT)
    assert task_domain(named.model_copy(update={"metadata": {**named.metadata, "domain": "gui"}})) == "gui"


@pytest.mark.slow
def test_the_report_has_a_matrix_per_domain_with_pass_k_and_pass_hat_k(tmp_path, scripted):
    home = tmp_path / "home"
    home.mkdir()
    scripted.load(SCRIPT)
    oracle = eval_gateway_config("oracle")
    scripted_route = GatewayConfig(models={"scripted": ModelRoute(model="openai/scripted", api_base=f"{scripted.url}/v1",
                                                                  api_key="unused")})
    runs = [("claw-mini", ["fault-mail-retry"], "oracle", oracle, 2), ("claw-bench", ["eml-001"], "oracle", oracle, 2),
            ("swe-mini", [PAGEKIT], "oracle", oracle, 1),
            ("claw-mini", ["mail-reply-budget"], "scripted", scripted_route, 2)]

    async def main() -> None:
        async with AsyncOrchard(home=home) as orchard:
            for index, (suite, tasks, model, config, attempts) in enumerate(runs):
                await run_eval(harness="react", model=model, suite=suite, task_ids=tasks, out_dir=tmp_path / f"run{index}",
                               gateway_config=config, orchard_client=orchard, attempts=attempts)
    try:
        asyncio.run(main())
    finally:
        remove_live_sandboxes(home)
    directories = [tmp_path / f"run{index}" for index in range(len(runs))]

    rows = domain_rows([run.results for run in load_runs(directories)])
    cells = {(row.domain, row.model): row for row in rows}
    assert list(cells) == [("claw", "oracle"), ("claw", "scripted"), ("swe", "oracle")]  # by domain
    claw = cells["claw", "oracle"]
    assert claw.suites == ["claw-mini", "claw-bench"] and (claw.finished, claw.attempts, claw.resolved) == (2, 4, 4)
    assert [(p.k, p.pass_at_k, p.pass_hat_k) for p in claw.pass_k] == [(1, 1.0, 1.0), (2, 1.0, 1.0)]
    assert {t.task_id: t.rewards for t in claw.per_task} == {"claw-mini/fault-mail-retry": [1.0, 1.0],
                                                            "claw-bench/eml-001": [1.0, 1.0]}
    scripted_cell = cells["claw", "scripted"]
    assert (scripted_cell.finished, scripted_cell.attempts, scripted_cell.resolved) == (1, 2, 1)
    assert sorted(scripted_cell.per_task[0].rewards) == [pytest.approx(0.2), 1.0]  # the give-up, unresolved
    assert [(p.k, p.pass_at_k, p.pass_hat_k) for p in scripted_cell.pass_k] == [(1, 0.5, 0.5), (2, 1.0, 0.0)]
    swe = cells["swe", "oracle"]
    assert (swe.suites, swe.attempts, swe.resolved, swe.k) == (["swe-mini"], 1, 1, 1)

    report = tmp_path / "report.html"
    done = cli.invoke(app, ["report", *map(str, directories), "--out", str(report)], env={"COLUMNS": "250"})
    assert done.exit_code == 0, done.output
    table = done.output[done.output.index("per domain: each harness with each model"):]
    lines = [line for line in table.splitlines() if "│" in line]
    assert any("claw" in line and "oracle" in line and "claw-mini, claw-bench" in line and "4/4" in line
               and "pass@1 100%, pass@2 100%; pass^2 100%" in line for line in lines), table
    assert any("claw" in line and "scripted" in line and "1/2" in line and "50%" in line
               and "pass@1 50%, pass@2 100%; pass^2 0%" in line for line in lines), table
    assert any(" swe " in line and "1/1" in line and "pass@1 100%" in line for line in lines), table
    html = report.read_text()
    assert "<h2>Domain claw: harness × model</h2>" in html and "<h2>Domain swe: harness × model</h2>" in html
    assert "pass@2 100% · pass^2 0%" in html and "2 task(s) of claw-mini, claw-bench" in html
