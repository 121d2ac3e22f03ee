"""Measurement: the embedded SmolLM2-135M's generation speed (orchard/policies/smollm2.py, kv_decode.py)
beside plain transformers `generate` on the same model object, in the same process, interleaved.

Three figures: prefill (prompt tokens read per second, one fresh ~1.3k-token prompt), decode (tokens
generated per second after the prefill), and an agent's conversation (every call's prompt is the last
one + the reply + a tool result, as a harness sends them: what the KV prefix cache is for). Plus the
time to load the model in a fresh process, from the cached float32 checkpoint against the GGUF."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.measurement import BenchContext, Measurement
from bench.results_model import Findings, Row, Target, ratio

PEER = "transformers generate"
TARGET_RATIO = 3.0
TOOL_RESULT = ("[exit code 1]\n" + "\n".join(f"tests/test_paginator.py::test_page_{i} FAILED - AssertionError: "
                                              f"expected {i} items, got {i + 1}" for i in range(8)))


def _long_messages(task_text: str) -> list[dict[str, Any]]:
    from orchard.harnesses.react.prompts import DEFAULT_INSTANCE_TEMPLATE, DEFAULT_SYSTEM_TEMPLATE, render

    variables = {"instruction": task_text, "workdir": "/testbed", "task_id": "bench"}
    return [{"role": "system", "content": render(DEFAULT_SYSTEM_TEMPLATE, **variables)},
            {"role": "user", "content": render(DEFAULT_INSTANCE_TEMPLATE, **variables)}]


def _instruction(min_tokens: int, tokenizer: Any) -> str:
    line = ("The paginator returns one item too many on every page after the first: page(n) slices "
            "items[start:end + 1]. Fix it so that each page has at most page_size items. ")
    text = line
    while len(tokenizer(text)["input_ids"]) < min_tokens:
        text += line
    return text


class _StepClock:
    """A logits processor that only notes when `generate` asks for each token: the first call comes right
    after the prefill, so one generate call gives both its prefill and its decode time."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.times.append(time.perf_counter())
        return scores


def _plain_generate(model: Any, torch: Any, prompt: list[int], new_tokens: int,
                    eos_id: int) -> tuple[float, float, int]:
    """Plain `generate` (greedy): (prefill seconds, decode seconds after the first token, tokens made)."""
    import transformers

    ids = torch.tensor([prompt])
    clock = _StepClock()
    started = time.perf_counter()
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                            do_sample=False, top_k=None, top_p=None, temperature=None, eos_token_id=eos_id,
                            pad_token_id=eos_id, logits_processor=transformers.LogitsProcessorList([clock]))
    ended = time.perf_counter()
    return clock.times[0] - started, ended - clock.times[0], output.shape[1] - len(prompt)


def _load_seconds(gguf_only: bool) -> float:
    """Seconds to load the model in a fresh Python process (from the GGUF when `gguf_only`)."""
    code = ("import time, transformers, torch\n"
            "from orchard.policies import smollm2\n"
            "gguf = smollm2.locate_gguf()\n"
            "t = time.perf_counter()\n"
            + ("transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, "
               "dtype=torch.float32, local_files_only=True)\n" if gguf_only else "smollm2.get_model()\n")
            + "print(time.perf_counter() - t)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1"))
    if done.returncode != 0:
        raise RuntimeError(f"loading smollm2 failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def run(ctx: BenchContext) -> Findings:
    import torch

    from orchard.policies import smollm2
    from orchard.policies.kv_decode import PrefixCache, decode

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = smollm2.get_model()  # loaded (and its checkpoint cached) before anything is timed
    load_ours, load_gguf = _load_seconds(False), _load_seconds(True)
    tokenizer, eos = model.tokenizer, model.end_of_turn_id
    prompt = model.prompt_ids(_long_messages(_instruction(ctx.pick(1100, 300), tokenizer)), None)
    repeats, new_tokens, turns = ctx.pick(3, 1), ctx.pick(48, 12), ctx.pick(4, 2)
    ours_prefill, peer_prefill, ours_decode, peer_decode = [], [], [], []
    with smollm2._torch_threads(torch, smollm2.generation_threads()), torch.inference_mode():
        _plain_generate(model.model, torch, prompt[:32], 2, eos)  # warm-up, both paths share the model
        for _ in range(repeats):  # interleaved, so that a load change on the machine hits both
            fresh = decode(model.model, prompt, max_new_tokens=new_tokens, eos_id=eos)
            ours_prefill.append(len(prompt) / fresh.prefill_s)
            ours_decode.append((len(fresh.ids) - 1) / fresh.decode_s)
            prefill_s, decode_s, produced = _plain_generate(model.model, torch, prompt, new_tokens, eos)
            peer_prefill.append(len(prompt) / prefill_s)
            peer_decode.append((produced - 1) / decode_s)
        ours_turns_s, peer_turns_s, completion_tokens, prompt_tokens = 0.0, 0.0, 0, 0
        cache = PrefixCache()
        conversation = list(prompt)
        for _ in range(turns):
            started = time.perf_counter()
            reply = decode(model.model, conversation, max_new_tokens=new_tokens, eos_id=eos, prefix_cache=cache)
            ours_turns_s += time.perf_counter() - started
            prefill_s, decode_s, _ = _plain_generate(model.model, torch, conversation, len(reply.ids), eos)
            peer_turns_s += prefill_s + decode_s
            completion_tokens += len(reply.ids)
            prompt_tokens += len(conversation)
            tool_turn = tokenizer(f"\n<|im_start|>user\n<tool_response>\n{TOOL_RESULT}\n</tool_response><|im_end|>\n"
                                  "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
            conversation = conversation + reply.ids + tool_turn
    prefill, peer_pre = statistics.median(ours_prefill), statistics.median(peer_prefill)
    dec, peer_dec = statistics.median(ours_decode), statistics.median(peer_decode)
    agent, peer_agent = completion_tokens / ours_turns_s, completion_tokens / peer_turns_s
    rows = [
        Row(metric=f"prefill, one fresh {len(prompt)}-token prompt", unit="tokens/s", ours=prefill,
            peers={PEER: peer_pre}, ratios={"orchard/generate": ratio(prefill, peer_pre)}),
        Row(metric="decode after that prompt (greedy)", unit="tokens/s", ours=dec, peers={PEER: peer_dec},
            ratios={"orchard/generate": ratio(dec, peer_dec)}),
        Row(metric=f"agent conversation: {turns} calls, {prompt_tokens} prompt tokens in all, completion "
                   "tokens per second of call time", unit="tokens/s", ours=agent, peers={PEER: peer_agent},
            ratios={"orchard/generate": ratio(agent, peer_agent)},
            targets=[Target(on="orchard/generate", op=">=", limit=TARGET_RATIO)]),
        Row(metric="load the model in a fresh process (first call's fixed cost)", unit="s", ours=load_ours,
            peers={"from the GGUF": load_gguf}, ratios={"orchard/gguf": ratio(load_ours, load_gguf)}),
    ]
    return Findings(rows=rows, notes=[
        f"Threads: {smollm2.generation_threads()} (ORCHARD_SMOLLM2_THREADS, else half the CPUs, at most 4).",
        "Both paths run the same float32 model object; a fresh call gives the same ids and logprobs "
        "(tests/test_kv_decode.py checks it). The peer is plain `model.generate` (greedy, KV cache, "
        "logits_to_keep=1), without the per-step logits copies the old path also asked for.",
        "Prefill and decode of a single fresh call are bound by the same matrix products in both paths; the "
        "gain is in the conversation, where each call reuses the KV states of the previous one.",
    ])


MEASUREMENT = Measurement(
    name="embedded_generation",
    title="Embedded policy generation (SmolLM2-135M, CPU)",
    method=("One process loads SmolLM2-135M (float32) once; the KV-cached decode loop and plain transformers "
            "`generate` run interleaved on the same model object and the same token ids. Prefill: a fresh "
            "react-style prompt of ~1.3k tokens (median of 3). Decode: the 48 greedy tokens after it, timed "
            "from the first token on (for `generate`, a logits processor notes when each token is asked for). Conversation: 4 calls, each prompt the previous one + the reply "
            "+ a tool result, the loop keeping its prefix cache, `generate` re-reading everything. Load: a "
            "fresh process, from the cached float32 checkpoint vs from the GGUF."),
    run=run,
)
