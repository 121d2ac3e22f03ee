"""The lean forward pass (orchard/policies/lean_llama.py) that smollm2 generates with by default, against the
transformers model it is built from: in float32 the same greedy ids and logprobs (fresh, and with the prefix
cache reusing a conversation's states across a cache that grows); in bfloat16 the ids are what it sampled,
each logprob is the float32 model's log-softmax at that position within a documented tolerance, and runs
repeat exactly. Fast tests on a tiny random Llama built from a config (real weights, real forward passes);
a slow one on the real SmolLM2-135M."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orchard.core.errors import ModelError  # noqa: E402
from orchard.policies.kv_decode import PrefixCache, decode  # noqa: E402
from orchard.policies.lean_llama import LeanLlama, UnsupportedModel  # noqa: E402
from tests.llama_rig import random_llama  # noqa: E402

pytestmark = pytest.mark.model  # torch and transformers

PROMPT = list(range(100, 400))  # longer than a new cache's 256 positions: the cache grows mid-prefill
BF16_TOLERANCE = 0.25  # docs/models.md: a bf16 logprob moved by up to ~0.1 from the float32 model's on SmolLM2


@pytest.fixture(scope="module")
def tiny_llama():
    """A random SmolLM2-shaped Llama (grouped-query heads, tied embeddings), weights wide enough that the
    next token is rarely a near tie, so greedy ids are a fair comparison."""
    return random_llama(512)


def reference(model, prompt, new_tokens, eos):
    ids = torch.tensor([prompt])
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, top_k=None, eos_token_id=eos,
                                           pad_token_id=eos, output_logits=True, return_dict_in_generate=True)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]


def model_logprobs(model, prompt, ids):
    """The float32 transformers model's log-softmax of each of `ids`, read in one teacher-forced forward."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


def test_float32_gives_generates_greedy_ids_and_logprobs(tiny_llama):
    expected_ids, expected_logprobs = reference(tiny_llama, PROMPT, 16, eos=7)
    with torch.inference_mode():
        got = decode(LeanLlama(tiny_llama, torch.float32), PROMPT, max_new_tokens=16, eos_id=7, top_logprobs=2)
    assert got.ids == expected_ids and len(got.logprobs) == len(got.top) == 16
    assert got.logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    assert got.logprobs == pytest.approx(model_logprobs(tiny_llama, PROMPT, got.ids), abs=1e-4)


def test_the_prefix_cache_over_lean_caches_changes_no_token(tiny_llama):
    lean, cache = LeanLlama(tiny_llama, torch.float32), PrefixCache(slots=2)
    with torch.inference_mode():
        first = decode(lean, PROMPT[:200], max_new_tokens=5, eos_id=7, prefix_cache=cache)
        follow_up = PROMPT[:200] + first.ids + PROMPT[200:]  # a reply, then a long tool result
        second = decode(lean, follow_up, max_new_tokens=8, eos_id=7, prefix_cache=cache)
        edited = follow_up[:50] + [5] + follow_up[51:]  # diverges early: only 50 positions are reused
        third = decode(lean, edited, max_new_tokens=8, eos_id=7, prefix_cache=cache)
    assert second.reused_prefix == 200 + len(first.ids) - 1 and third.reused_prefix == 50
    for got, prompt in ((second, follow_up), (third, edited)):
        expected_ids, expected_logprobs = reference(tiny_llama, prompt, 8, eos=7)
        assert got.ids == expected_ids
        assert got.logprobs == pytest.approx(expected_logprobs, abs=1e-4)


def test_bfloat16_logprobs_are_the_models_within_tolerance_and_runs_repeat(tiny_llama):
    lean = LeanLlama(tiny_llama, torch.bfloat16)
    assert lean.layers[0].qkv.dtype == torch.bfloat16 and lean.lm_head.dtype == torch.float32
    with torch.inference_mode():
        runs = [decode(lean, PROMPT, max_new_tokens=12, eos_id=7) for _ in range(2)]
    assert runs[0].ids == runs[1].ids and runs[0].logprobs == runs[1].logprobs
    got = runs[0]
    assert len(got.ids) == len(got.logprobs) == 12 and all(lp <= 0 for lp in got.logprobs)
    assert got.logprobs == pytest.approx(model_logprobs(tiny_llama, PROMPT, got.ids), abs=BF16_TOLERANCE)
    # the same request again, all but its last prompt token from the prefix cache: the same bits
    cache = PrefixCache()
    with torch.inference_mode():
        cached = [decode(lean, PROMPT, max_new_tokens=12, eos_id=7, prefix_cache=cache) for _ in range(2)]
    assert cached[1].reused_prefix == len(PROMPT) - 1
    assert cached[0].ids == cached[1].ids == got.ids and cached[0].logprobs == cached[1].logprobs == got.logprobs


def test_bfloat16_logits_of_the_likely_tokens_are_float32s(tiny_llama):
    """The bf16 output projection scores the vocabulary, then the best REFINED tokens again in float32: their
    logits (so the greedy choice) are the float32 projection's, to float32 rounding."""
    from orchard.policies.lean_llama import REFINED

    lean = LeanLlama(tiny_llama, torch.bfloat16)
    torch.manual_seed(0)
    last = torch.randn(1, tiny_llama.config.hidden_size)
    with torch.inference_mode():
        got, exact = lean._logits(last)[0], torch.mv(lean.lm_head, last[0])
    best = exact.topk(REFINED // 2).indices  # well inside the re-scored set whatever bf16's rounding did
    assert torch.allclose(got[best], exact[best], rtol=0, atol=1e-5) and int(got.argmax()) == int(exact.argmax())
    assert got.shape == exact.shape and (got - exact).abs().max() < 0.1 * exact.abs().max()


def test_a_model_of_another_architecture_is_refused_by_name():
    from orchard.recipes.tiny_models import tiny_qwen3

    with pytest.raises(UnsupportedModel, match="implements LlamaForCausalLM, not Qwen3ForCausalLM.*transformers engine"):
        LeanLlama(tiny_qwen3(seed=0))


def test_engine_settings_come_from_the_environment(monkeypatch):
    from orchard.policies.smollm2 import EngineSettings

    monkeypatch.delenv("ORCHARD_SMOLLM2_ENGINE", raising=False)
    monkeypatch.delenv("ORCHARD_SMOLLM2_DTYPE", raising=False)
    default = EngineSettings.from_environment()
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert default.engine == "lean" and default.lean_dtype(torch) == (torch.bfloat16 if native else torch.float32)
    monkeypatch.setenv("ORCHARD_SMOLLM2_ENGINE", "transformers")
    monkeypatch.setenv("ORCHARD_SMOLLM2_DTYPE", "float32")
    chosen = EngineSettings.from_environment()
    assert chosen.engine == "transformers" and chosen.lean_dtype(torch) == torch.float32
    monkeypatch.setenv("ORCHARD_SMOLLM2_ENGINE", "llama.cpp")
    with pytest.raises(ModelError, match="ORCHARD_SMOLLM2_ENGINE is lean, transformers or llama_cpp"):
        EngineSettings.from_environment()


# --- the real SmolLM2 -------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_lean_engines_against_the_transformers_model():
    """float32: generate's greedy ids on a few prompts; bfloat16 (the default where the CPU has bf16): every
    logprob within the documented tolerance of the float32 model's, ids exactly what was sampled."""
    from orchard.policies import smollm2

    model = smollm2.get_model()
    questions = ["What is the capital of France?", "Write a bash command that lists the files in /tmp.",
                 "Name three colours."]
    engines = {"float32": LeanLlama(model.model, torch.float32), "bfloat16": LeanLlama(model.model, torch.bfloat16)}
    for question in questions:
        prompt = model.prompt_ids([{"role": "user", "content": question}], None)
        expected_ids, expected_logprobs = reference(model.model, prompt, 16, eos=model.end_of_turn_id)
        with smollm2._torch_threads(torch, smollm2.generation_threads()), torch.inference_mode():
            exact = decode(engines["float32"], prompt, max_new_tokens=16, eos_id=model.end_of_turn_id)
            fast = decode(engines["bfloat16"], prompt, max_new_tokens=16, eos_id=model.end_of_turn_id)
        assert exact.ids == expected_ids
        assert exact.logprobs == pytest.approx(expected_logprobs, abs=1e-4)
        assert fast.logprobs == pytest.approx(model_logprobs(model.model, prompt, fast.ids), abs=BF16_TOLERANCE)
