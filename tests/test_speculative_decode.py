"""Prompt-lookup speculative decoding, transformers' own (`prompt_lookup_num_tokens`, which kv_decode.py
passes to `generate` for greedy calls when smollm2 is asked for it): greedy output must be one-token
decoding's, with the prefix cache too. A tiny random Llama with a 24-token vocabulary: its greedy text
repeats n-grams often, so drafts are made, partly accepted and partly rejected (real weights, real
forward passes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orchard.core.errors import ModelError  # noqa: E402
from orchard.policies.kv_decode import PrefixCache, decode  # noqa: E402
from tests.llama_rig import random_llama  # noqa: E402

pytestmark = pytest.mark.model  # torch and transformers

PROMPT = list(range(10, 20)) * 3
NO_EOS = 99  # outside the vocabulary: generation runs to max_new_tokens


@pytest.fixture(scope="module")
def small_vocab_llama():
    return random_llama(24)


def test_greedy_speculation_emits_one_token_decodings_ids_and_logprobs(small_vocab_llama):
    with torch.inference_mode():
        plain = decode(small_vocab_llama, PROMPT, max_new_tokens=100, eos_id=NO_EOS, top_logprobs=2)
        fast = decode(small_vocab_llama, PROMPT, max_new_tokens=100, eos_id=NO_EOS, top_logprobs=2, speculate=8)
    assert fast.ids == plain.ids and fast.hit_limit and len(fast.logprobs) == 100
    assert fast.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
    assert [[i for i, _ in top] for top in fast.top] == [[i for i, _ in top] for top in plain.top]


def test_end_of_turn_and_the_token_limit_end_speculative_generation_there(small_vocab_llama):
    with torch.inference_mode():
        plain = decode(small_vocab_llama, PROMPT, max_new_tokens=100, eos_id=NO_EOS)
        for limit in (13, 37):
            got = decode(small_vocab_llama, PROMPT, max_new_tokens=limit, eos_id=NO_EOS, speculate=8)
            assert got.ids == plain.ids[:limit] and got.hit_limit
        eos = plain.ids[40]
        expected = plain.ids[:plain.ids.index(eos) + 1]
        got = decode(small_vocab_llama, PROMPT, max_new_tokens=100, eos_id=eos, speculate=8)
    assert got.ids == expected and not got.hit_limit


def test_speculative_and_plain_calls_of_a_conversation_share_the_prefix_cache_safely(small_vocab_llama):
    """transformers' prompt lookup does not continue a filled cache correctly, so a speculative call reads its
    whole prompt; its cache still serves the next plain call. Every call generates what a fresh,
    non-speculative call generates."""
    cache, conversation = PrefixCache(slots=2), list(PROMPT)
    with torch.inference_mode():
        for turn, speculate in enumerate((8, 0, 8, 8)):
            got = decode(small_vocab_llama, conversation, max_new_tokens=30, eos_id=NO_EOS, prefix_cache=cache,
                         speculate=speculate)
            fresh = decode(small_vocab_llama, conversation, max_new_tokens=30, eos_id=NO_EOS)
            assert got.ids == fresh.ids and got.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)
            # a plain call reuses all but the tool result and the last reply token
            assert got.reused_prefix == (len(conversation) - 3 if not speculate else 0)
            conversation = conversation + got.ids + [turn + 1, turn + 2]  # the reply, then a tool result


def test_sampling_is_not_speculated_and_a_seed_repeats(small_vocab_llama):
    runs = []
    for speculate in (0, 8):
        torch.manual_seed(4)
        with torch.inference_mode():
            runs.append(decode(small_vocab_llama, PROMPT, max_new_tokens=20, eos_id=NO_EOS, temperature=0.7,
                               top_k=10, speculate=speculate))
    assert runs[0].ids == runs[1].ids and runs[1].logprobs == runs[0].logprobs


def test_speculation_is_set_from_the_environment_and_off_by_default(monkeypatch):
    """Off unless asked for: on replies that copy nothing transformers' prompt lookup decoded slower."""
    from orchard.policies.smollm2 import EngineSettings

    monkeypatch.delenv("ORCHARD_SMOLLM2_SPECULATE", raising=False)
    assert EngineSettings.from_environment().speculate == 0
    monkeypatch.setenv("ORCHARD_SMOLLM2_SPECULATE", "6")
    assert EngineSettings.from_environment().speculate == 6
    monkeypatch.setenv("ORCHARD_SMOLLM2_SPECULATE", "lots")
    with pytest.raises(ModelError, match="ORCHARD_SMOLLM2_SPECULATE a draft length 0-32"):
        EngineSettings.from_environment()


# --- the real SmolLM2 -------------------------------------------------------------------------------

PLAIN_PROMPTS = (  # replies that copy nothing of their prompt, and one that copies it
    "Write a short story about a lighthouse keeper who finds a strange bottle.",
    "Explain in a few sentences why the sky looks blue during the day.",
    "Repeat this command exactly: cd /srv/app && python -m pytest tests/test_config.py -q --maxfail=1",
)


@pytest.mark.slow
def test_smollm2_speculation_changes_no_token():
    """The real SmolLM2 in float32, on replies that copy nothing of their prompt and one that copies it: the
    ids are one-token decoding's."""
    from orchard.policies import smollm2

    model = smollm2.get_model()
    for text in PLAIN_PROMPTS:
        prompt = model.prompt_ids([{"role": "user", "content": text}], None)
        with smollm2.torch_threads(torch, smollm2.generation_threads()), torch.inference_mode():
            plain = decode(model.model, prompt, max_new_tokens=48, eos_id=model.end_of_turn_id)
            fast = decode(model.model, prompt, max_new_tokens=48, eos_id=model.end_of_turn_id, speculate=8)
        assert fast.ids == plain.ids, text
        assert fast.logprobs == pytest.approx(plain.logprobs, abs=1e-3)
