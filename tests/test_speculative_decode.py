"""Prompt-lookup speculative decoding (orchard/policies/prompt_lookup.py drafts, kv_decode.py verifies them
with lean_llama.LeanLlama.verify): greedy output must be exactly one-token decoding's, whatever the drafts.
A tiny random Llama with a 24-token vocabulary: its greedy text repeats n-grams often, so drafts are made,
partly accepted and partly rejected (real weights, real forward passes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orchard.core.errors import ModelError  # noqa: E402
from orchard.policies.kv_decode import PrefixCache, decode  # noqa: E402
from orchard.policies.lean_llama import LeanLlama  # noqa: E402
from orchard.policies.prompt_lookup import draft  # noqa: E402
from tests.llama_rig import random_llama  # noqa: E402

pytestmark = pytest.mark.model  # torch and transformers

PROMPT = list(range(10, 20)) * 3
NO_EOS = 99  # outside the vocabulary: generation runs to max_new_tokens


@pytest.fixture(scope="module")
def small_vocab_llama():
    return random_llama(24)


def test_a_draft_is_what_followed_the_last_ngrams_most_recent_occurrence():
    assert draft([1, 2, 3, 4, 5, 9, 1, 2, 3], tokens=4) == [4, 5, 9, 1]
    assert draft([7, 2, 3, 8, 1, 2, 3, 6, 0, 2, 3], tokens=2) == [6, 0]  # the most recent match wins
    assert draft([1, 2, 3, 4], tokens=4) == [] and draft([5, 5], tokens=0) == []


def test_greedy_speculation_emits_one_token_decodings_ids_and_logprobs(small_vocab_llama):
    """float32, where speculation is on by default: the verified rows go through the matrix product, a
    decode step through the matrix-vector one; they agree to float32 rounding, and the ids are the same."""
    lean = LeanLlama(small_vocab_llama, torch.float32)
    with torch.inference_mode():
        plain = decode(lean, PROMPT, max_new_tokens=100, eos_id=NO_EOS, top_logprobs=2)
        fast = decode(lean, PROMPT, max_new_tokens=100, eos_id=NO_EOS, top_logprobs=2, speculate=8)
    assert 0 < fast.accepted < fast.drafted  # drafts were both taken and turned down
    assert plain.drafted == 0 and fast.ids == plain.ids and fast.hit_limit
    assert fast.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
    assert [[i for i, _ in top] for top in fast.top] == [[i for i, _ in top] for top in plain.top]


def test_end_of_turn_and_the_token_limit_inside_an_accepted_draft_end_generation_there(small_vocab_llama):
    lean = LeanLlama(small_vocab_llama, torch.float32)
    with torch.inference_mode():
        plain = decode(lean, PROMPT, max_new_tokens=100, eos_id=NO_EOS)
        for limit in (13, 37, 61):
            got = decode(lean, PROMPT, max_new_tokens=limit, eos_id=NO_EOS, speculate=8)
            assert got.ids == plain.ids[:limit] and got.hit_limit
        eos = plain.ids[40]
        expected = plain.ids[:plain.ids.index(eos) + 1]
        got = decode(lean, PROMPT, max_new_tokens=100, eos_id=eos, speculate=8)
    assert got.ids == expected and not got.hit_limit


def test_the_cache_rolled_back_past_rejected_drafts_serves_a_conversation(small_vocab_llama):
    """Each call's cache (rejected draft positions cropped) goes to the prefix cache and the next call
    extends it: every call generates what a fresh, non-speculative call generates."""
    lean, cache = LeanLlama(small_vocab_llama, torch.float32), PrefixCache(slots=2)
    conversation = list(PROMPT)
    with torch.inference_mode():
        for turn in range(3):
            got = decode(lean, conversation, max_new_tokens=30, eos_id=NO_EOS, prefix_cache=cache, speculate=8)
            fresh = decode(lean, conversation, max_new_tokens=30, eos_id=NO_EOS)
            assert got.ids == fresh.ids and got.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)
            if turn:
                assert got.reused_prefix == len(conversation) - 3  # all but the tool result and the last reply token
            conversation = conversation + got.ids + [turn + 1, turn + 2]  # the reply, then a tool result
    assert got.drafted > 0


def test_sampling_is_not_speculated_and_a_seed_repeats(small_vocab_llama):
    lean = LeanLlama(small_vocab_llama, torch.bfloat16)
    runs = []
    for speculate in (0, 8, 8):
        torch.manual_seed(4)
        with torch.inference_mode():
            runs.append(decode(lean, PROMPT, max_new_tokens=20, eos_id=NO_EOS, temperature=0.7, top_k=10,
                               speculate=speculate))
    assert runs[0].ids == runs[1].ids == runs[2].ids and runs[1].logprobs == runs[0].logprobs
    assert runs[1].drafted == 0


def test_speculation_is_set_from_the_environment_and_on_by_default_in_float32_only(monkeypatch):
    """bfloat16's many-row verify pass rounds differently from its one-row decode pass (up to 0.19 in a
    logit on an AMD EPYC), so a near tie could turn greedy output: there it is opt-in."""
    from orchard.policies.prompt_lookup import DEFAULT_DRAFT_TOKENS
    from orchard.policies.smollm2 import EngineSettings

    monkeypatch.delenv("ORCHARD_SMOLLM2_SPECULATE", raising=False)
    default = EngineSettings.from_environment()
    assert default.speculate is None
    assert default.draft_tokens(torch.float32) == DEFAULT_DRAFT_TOKENS and default.draft_tokens(torch.bfloat16) == 0
    monkeypatch.setenv("ORCHARD_SMOLLM2_SPECULATE", "0")
    assert EngineSettings.from_environment().draft_tokens(torch.float32) == 0
    monkeypatch.setenv("ORCHARD_SMOLLM2_SPECULATE", "6")
    assert EngineSettings.from_environment().draft_tokens(torch.bfloat16) == 6
    monkeypatch.setenv("ORCHARD_SMOLLM2_SPECULATE", "lots")
    with pytest.raises(ModelError, match="ORCHARD_SMOLLM2_SPECULATE a draft length 0-32"):
        EngineSettings.from_environment()


# --- the real SmolLM2 -------------------------------------------------------------------------------

PLAIN_PROMPTS = (  # replies that copy nothing of their prompt, and one that copies it
    "Write a short story about a lighthouse keeper who finds a strange bottle.",
    "Explain in a few sentences why the sky looks blue during the day.",
    "List three ideas for a birthday present for a friend who likes hiking.",
    "Repeat this command exactly: cd /srv/app && python -m pytest tests/test_config.py -q --maxfail=1",
)


@pytest.mark.slow
def test_smollm2_speculation_changes_no_token():
    """The real SmolLM2 in float32 (where speculation is on by default), on replies that copy nothing of
    their prompt and one that copies it: the ids are one-token decoding's."""
    from orchard.policies import smollm2

    model = smollm2.get_model()
    engine = LeanLlama(model.model, torch.float32)
    accepted = 0
    for text in PLAIN_PROMPTS:
        prompt = model.prompt_ids([{"role": "user", "content": text}], None)
        with smollm2._torch_threads(torch, smollm2.generation_threads()), torch.inference_mode():
            plain = decode(engine, prompt, max_new_tokens=48, eos_id=model.end_of_turn_id)
            fast = decode(engine, prompt, max_new_tokens=48, eos_id=model.end_of_turn_id, speculate=8)
        assert fast.ids == plain.ids, text
        assert fast.logprobs == pytest.approx(plain.logprobs, abs=1e-3)
        accepted += fast.accepted
    assert accepted > 0  # the copying reply took drafts
