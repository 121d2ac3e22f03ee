"""Measurement: the embedded SmolLM2-135M's generation speed (orchard/policies/smollm2.py: kv_decode.py's
loop over lean_llama.py) beside plain transformers `generate` on the same weights, in the same process,
interleaved; the lean forward pass in float32 (the exact setting) beside them.

Three figures: prefill (prompt tokens read per second, one fresh ~1.3k-token prompt), decode (tokens
generated per second after the prefill), and an agent's conversation (every call's prompt is the last
one + the reply + a tool result, as a harness sends them: what the KV prefix cache is for). Plus a first
call in a fresh process (load + a short answer), beside the bare GGUF load it used to be."""

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
LLAMA_CPP = "llama.cpp (Q4_1, inference only)"
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


def _first_call_seconds(gguf_only: bool, engine: str | None = None) -> float:
    """Seconds from nothing loaded to a 16-token answer in a fresh Python process (smollm2 as configured);
    with `gguf_only`, just the load from the GGUF, what every first call cost before the checkpoint cache."""
    code = ("import time, transformers, torch\n"
            "from orchard.policies import smollm2\n"
            "gguf = smollm2.locate_gguf()\n"
            "t = time.perf_counter()\n"
            + ("transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, "
               "dtype=torch.float32, local_files_only=True)\n" if gguf_only else
               "smollm2.complete([{'role': 'user', 'content': 'What is the capital of France?'}], None, "
               "{'max_tokens': 16})\n")
            + "print(time.perf_counter() - t)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    if engine:
        env["ORCHARD_SMOLLM2_ENGINE"] = engine
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"loading smollm2 failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def _conversation(engine: Any, prompt: list[int], replies: list[list[int]] | None, turns: int, new_tokens: int,
                  eos: int, tool_turn: list[int], speculate: int) -> tuple[float, list[list[int]], int]:
    """An agent's calls through kv_decode with a prefix cache: (seconds of call time, the replies, prompt
    tokens in all). Each prompt is the last one + its reply + `tool_turn`; given `replies`, those are the
    replies fed back (so every engine is asked the very same prompts), else its own."""
    from orchard.policies.kv_decode import PrefixCache, decode

    cache, conversation, seconds, made, prompt_tokens = PrefixCache(), list(prompt), 0.0, [], 0
    for turn in range(turns):
        started = time.perf_counter()
        reply = decode(engine, conversation, max_new_tokens=new_tokens, eos_id=eos, prefix_cache=cache,
                       speculate=speculate)
        seconds += time.perf_counter() - started
        made.append(reply.ids)
        prompt_tokens += len(conversation)
        conversation = conversation + (replies[turn] if replies else reply.ids) + tool_turn
    return seconds, made, prompt_tokens


def _llama_cpp(server: Any, prompt: list[int], new_tokens: int, cache_prompt: bool) -> Any:
    return server.complete(prompt, max_new_tokens=new_tokens, temperature=None, top_k=1, top_p=None, seed=None,
                           top_logprobs=0, stop=[], timeout_s=600, cache_prompt=cache_prompt)


def _llama_cpp_conversation(server: Any, prompt: list[int], replies: list[list[int]],
                            tool_turn: list[int]) -> tuple[float, int]:
    """The same prompts as `_conversation` (Orchard's replies fed back), each call at most as long as Orchard's
    reply; (seconds of call time, wall clock through its HTTP API, completion tokens made)."""
    conversation, seconds, made = list(prompt), 0.0, 0
    for reply in replies:
        started = time.perf_counter()
        made += len(_llama_cpp(server, conversation, len(reply), True).ids)
        seconds += time.perf_counter() - started
        conversation = conversation + reply + tool_turn
    return seconds, made


def _start_llama_cpp(gguf: Any, threads: int) -> Any:
    """llama-server for the comparison, or None (with the reason on stderr) when its runtime cannot be had."""
    from orchard.core.errors import ModelError
    from orchard.policies.llama_cpp_engine import LlamaServer
    from orchard.policies.llama_cpp_runtime import ensure_runtime

    try:
        return LlamaServer(ensure_runtime(), gguf, threads=threads, context=8192)
    except ModelError as exc:
        print(f"embedded_generation: no llama.cpp column: {exc}", file=sys.stderr)
        return None


def run(ctx: BenchContext) -> Findings:
    from orchard.policies import smollm2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = smollm2.get_model()  # loaded (and its checkpoint cached) before anything is timed
    first_call, load_gguf = _first_call_seconds(False), _first_call_seconds(True)
    server = _start_llama_cpp(smollm2.locate_gguf(), smollm2.generation_threads())
    first_call_llama = _first_call_seconds(False, "llama_cpp") if server is not None else None
    try:
        return _measure(ctx, model, server, first_call, load_gguf, first_call_llama)
    finally:
        if server is not None:
            server.close()


def _measure(ctx: BenchContext, model: Any, server: Any, first_call: float, load_gguf: float,
             first_call_llama: float | None) -> Findings:
    import torch

    from orchard.policies import smollm2
    from orchard.policies.kv_decode import decode
    from orchard.policies.lean_llama import LeanLlama

    tokenizer, eos = model.tokenizer, model.end_of_turn_id
    ours, dtype = model.engine, getattr(model.engine, "dtype", torch.float32)
    exact = LeanLlama(model.model, torch.float32)
    prompt = model.prompt_ids(_long_messages(_instruction(ctx.pick(1100, 300), tokenizer)), None)
    repeats, new_tokens, turns = ctx.pick(3, 1), ctx.pick(48, 12), ctx.pick(4, 2)
    tool_turn = tokenizer(f"\n<|im_start|>user\n<tool_response>\n{TOOL_RESULT}\n</tool_response><|im_end|>\n"
                          "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    prefill: dict[str, list[float]] = {"ours": [], "plain": [], "exact": [], "peer": [], "llama": []}
    dec: dict[str, list[float]] = {"ours": [], "plain": [], "exact": [], "peer": [], "llama": []}
    # smollm2's prompt-lookup speculation (greedy: it changes no token) for ours; "plain" is the same engine
    # without it (what a sampled request gets: speculation is greedy only), the float32 row without it too
    speculate = {"ours": model.speculate, "plain": 0, "exact": 0}
    drafts = {"ours": [0, 0], "plain": [0, 0], "exact": [0, 0]}  # draft tokens verified, accepted
    with smollm2._torch_threads(torch, smollm2.generation_threads()), torch.inference_mode():
        _plain_generate(model.model, torch, prompt[:32], 2, eos)  # warm-up
        decode(ours, prompt[:32], max_new_tokens=2, eos_id=eos)
        if server is not None:
            _llama_cpp(server, prompt[:32], 2, False)
        for _ in range(repeats):  # interleaved, so that a load change on the machine hits every path
            for name, engine in (("ours", ours), ("plain", ours), ("exact", exact)):
                fresh = decode(engine, prompt, max_new_tokens=new_tokens, eos_id=eos, speculate=speculate[name])
                drafts[name][0] += fresh.drafted
                drafts[name][1] += fresh.accepted
                prefill[name].append(len(prompt) / fresh.prefill_s)
                dec[name].append((len(fresh.ids) - 1) / fresh.decode_s)
            prefill_s, decode_s, produced = _plain_generate(model.model, torch, prompt, new_tokens, eos)
            prefill["peer"].append(len(prompt) / prefill_s)
            dec["peer"].append((produced - 1) / decode_s)
            if server is not None:  # the server's own clock, as kv_decode's: prompt, then the tokens after
                fresh = _llama_cpp(server, prompt, new_tokens, False)
                prefill["llama"].append(len(prompt) / (fresh.prompt_ms / 1000))
                if len(fresh.ids) > 1 and fresh.predicted_ms > 0:  # it may end its turn at once
                    dec["llama"].append((len(fresh.ids) - 1) / (fresh.predicted_ms / 1000))
        # the conversation: ours chooses the replies, the others are fed the same ones
        ours_s, replies, prompt_tokens = _conversation(ours, prompt, None, turns, new_tokens, eos, tool_turn,
                                                       speculate["ours"])
        exact_s, _, _ = _conversation(exact, prompt, replies, turns, new_tokens, eos, tool_turn, 0)
        peer_s, conversation = 0.0, list(prompt)
        for reply in replies:
            prefill_s, decode_s, _ = _plain_generate(model.model, torch, conversation, len(reply), eos)
            peer_s += prefill_s + decode_s
            conversation = conversation + reply + tool_turn
        llama_s, llama_made = _llama_cpp_conversation(server, prompt, replies, tool_turn) if server else (0.0, 0)
    completion_tokens = sum(len(reply) for reply in replies)
    pre = {name: statistics.median(values) for name, values in prefill.items() if values}
    dec_rate = {name: statistics.median(values) for name, values in dec.items() if values}
    agent = {"ours": completion_tokens / ours_s, "exact": completion_tokens / exact_s,
             "peer": completion_tokens / peer_s}
    if server is not None:
        agent["llama"] = llama_made / llama_s
    exact_name = "orchard float32 (exact)"

    def row(metric: str, figures: dict[str, float], targets: list[Target] | None = None) -> Row:
        peers = {PEER: figures["peer"], exact_name: figures["exact"]}
        ratios = {"orchard/generate": ratio(figures["ours"], figures["peer"]),
                  "float32/generate": ratio(figures["exact"], figures["peer"])}
        if "llama" in figures:
            peers[LLAMA_CPP] = figures["llama"]
            ratios["llama_cpp/generate"] = ratio(figures["llama"], figures["peer"])
        return Row(metric=metric, unit="tokens/s", ours=figures["ours"], peers=peers, ratios=ratios,
                   targets=targets or [])

    rows = [
        row(f"prefill, one fresh {len(prompt)}-token prompt", pre, [Target(on="orchard/generate", op=">=", limit=TARGET_RATIO)]),
        row("decode after that prompt (greedy)", dec_rate, [Target(on="orchard/generate", op=">=", limit=TARGET_RATIO)]),
        Row(metric="decode after that prompt, no speculation (as sampled requests decode)", unit="tokens/s",
            ours=dec_rate["plain"], peers={PEER: dec_rate["peer"]},
            ratios={"orchard/generate": ratio(dec_rate["plain"], dec_rate["peer"])}),
        row(f"agent conversation: {turns} calls, {prompt_tokens} prompt tokens in all, completion tokens per "
            "second of call time", agent, [Target(on="orchard/generate", op=">=", limit=TARGET_RATIO)]),
        Row(metric="first call in a fresh process: load + a 16-token answer", unit="s", ours=first_call,
            peers={"GGUF load alone (the first call before the checkpoint cache)": load_gguf},
            ratios={"orchard/gguf": ratio(first_call, load_gguf)}),
    ]
    if first_call_llama is not None:
        rows.append(Row(metric="first call in a fresh process, ORCHARD_SMOLLM2_ENGINE=llama_cpp (runtime built)",
                        unit="s", ours=first_call_llama, peers={"configured engine": first_call},
                        ratios={"llama_cpp/configured": ratio(first_call_llama, first_call)}))
    return Findings(rows=rows, notes=[
        f"Orchard = smollm2's configured engine: {smollm2.EngineSettings.from_environment().engine}, "
        f"{str(dtype).removeprefix('torch.')} weights (lean_llama.py: fused projections, the rotary embedding as one "
        "complex product, an in-place KV cache in the weights' dtype, bf16 matrix-vector products and AMX tiles "
        "where the CPU has them, the 64 best-scored tokens' logits re-scored in float32). All three rows' "
        "targets are on it. Greedy decoding there uses prompt-lookup speculation (ORCHARD_SMOLLM2_SPECULATE="
        f"{speculate['ours']}; exact: the same tokens): in the decode row {drafts['ours'][1]} of "
        f"{drafts['ours'][0]} draft tokens were accepted. `orchard float32 (exact)` is the "
        "same forward pass in float32 (generate's greedy ids, logprobs to 1e-4). Threads: "
        f"{smollm2.generation_threads()} (ORCHARD_SMOLLM2_THREADS, else half the CPUs, at most 4).",
        "The peer is plain `model.generate` on the transformers model (float32, greedy, its own KV cache, "
        "logits_to_keep=1). In the conversation every path is given the same prompts (Orchard's replies fed "
        "back); Orchard and float32 keep a prefix cache, `generate` re-reads each prompt.",
        f"`{LLAMA_CPP}`: the llama_cpp engine's llama-server (Debian forky's llama.cpp, ggml CPU variant "
        "for this CPU) on the Q4_1 GGUF itself, same threads, same token ids; prefill and decode from the "
        "server's own timings (fresh prompt, no prompt cache), the conversation by wall clock through its "
        "HTTP API with its prompt cache, each reply at most as long as Orchard's (it may stop earlier: it "
        "runs other weights). Inference only: its logprobs are the quantized model's.",
    ])


MEASUREMENT = Measurement(
    name="embedded_generation",
    title="Embedded policy generation (SmolLM2-135M, CPU)",
    method=("One process loads SmolLM2-135M once; smollm2's engine (kv_decode.py's loop over lean_llama.py), "
            "the same loop over the lean forward pass in float32, and plain transformers `generate` run "
            "interleaved on the same weights and the same token ids. Prefill: a fresh react-style prompt of "
            "~1.3k tokens (median of 3). Decode: the 48 greedy tokens after it, timed from the first token on "
            "(for `generate`, a logits processor notes when each token is asked for). Conversation: 4 calls, "
            "each prompt the previous one + the reply + a tool result. First call: a fresh process, from "
            "nothing loaded to a 16-token answer (cached checkpoint), beside the bare GGUF load."),
    run=run,
)
