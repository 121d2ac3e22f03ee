"""Measurement: the embedded SmolLM2-135M's generation speed (orchard/policies/smollm2/: `generate` with
kv_decode.py's prefix cache) beside transformers' own configurations on the same weights, in the same process,
interleaved (bench/generation_peers.py: `generate` plain, with a static cache, with prompt lookup, in
bfloat16, compiled). A hand-written engine (lean_llama.py) ran here until it was measured beside them: it
was not 1.5x the best of them (docs/BENCHMARKS.md §12, docs/models.md), so it was removed.

Three figures: prefill (prompt tokens read per second, one fresh ~1.3k-token prompt), decode (tokens
generated per second after the prefill, on prompts whose replies do not copy them: an agent's task and
plain instructions), and an agent's conversation (every call's prompt is the last one + the reply + a tool
result, as a harness sends them: what the KV prefix cache is for; transformers keeps its cache across the
calls too). Plus a first call in a fresh process (load + a short answer), beside the bare GGUF load."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.measurement import BenchContext, Measurement
from bench.generation_peers import DRAFT_TOKENS, agent_messages, conversation, decode_prompts, generate, peers
from bench.results_model import Findings, Row, ratio

OURS = "orchard"
# issue 23's decision, kept beside the figures it was taken on (two runs of this bench, 2026-12-01)
REMOVED_ENGINE = ("Until issue 23 smollm2 ran a hand-written engine (lean_llama.py: bf16 forward pass, its own decode "
                  "loop and prompt lookup). Two runs of this bench set it beside transformers' best configuration: "
                  "prefill 1.20× and 1.22×, decode of replies that copy nothing 1.18× and 1.32×, the 4-call "
                  "conversation 0.85× (1.51× with its opt-in, inexact bf16 prompt lookup): under the 1.5× that "
                  "keeping it needed, so it was removed (docs/models.md).")
LLAMA_CPP = "llama.cpp (Q4_1, inference only)"
TOOL_RESULT = ("[exit code 1]\n" + "\n".join(f"tests/test_paginator.py::test_page_{i} FAILED - AssertionError: "
                                              f"expected {i} items, got {i + 1}" for i in range(8)))


def _instruction(min_tokens: int, tokenizer: Any) -> str:
    line = ("The paginator returns one item too many on every page after the first: page(n) slices "
            "items[start:end + 1]. Fix it so that each page has at most page_size items. ")
    text = line
    while len(tokenizer(text)["input_ids"]) < min_tokens:
        text += line
    return text


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
    """An agent's calls through smollm2's engine with a prefix cache: (seconds of call time, the replies, prompt
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

    tokenizer, eos = model.tokenizer, model.end_of_turn_id
    ours, dtype = model.engine, getattr(model.engine, "dtype", torch.float32)
    # bf16 peers where the CPU computes bf16 natively (AVX512-BF16 or AMX): elsewhere bf16 is emulated, slow
    bf16 = any(getattr(torch.cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported",
                                                                          "_is_amx_tile_supported"))
    long_prompt = model.prompt_ids(agent_messages(_instruction(ctx.pick(1100, 300), tokenizer)), None)
    prompts = decode_prompts(model)[:ctx.pick(4, 2)]
    repeats, new_tokens, turns = ctx.pick(3, 1), ctx.pick(48, 12), ctx.pick(4, 2)
    tool_turn = tokenizer(f"\n<|im_start|>user\n<tool_response>\n{TOOL_RESULT}\n</tool_response><|im_end|>\n"
                          "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    paths = {OURS: (ours, model.speculate)}  # smollm2's engine as configured (ORCHARD_SMOLLM2_* settings)
    compile_note = ""
    with smollm2.torch_threads(torch, smollm2.generation_threads()), torch.inference_mode():
        hf = peers(model.model, bf16, compile_peer=not ctx.quick, max_cache_len=len(long_prompt) + new_tokens)
        for peer in list(hf):  # warm-up; the compiled peer compiles its decode step here
            started = time.perf_counter()
            try:
                generate(peer, long_prompt[:64], 3, eos)
            except Exception as exc:  # noqa: BLE001 - a compile failure is a finding, not a crash
                compile_note = f"{peer.name} failed: {type(exc).__name__}: {str(exc)[:300]}"
                hf.remove(peer)
                continue
            if "compiled" in peer.name:
                compile_note = (f"{peer.name}: its first call (the compile; less with inductor's cache "
                                f"warm) took {time.perf_counter() - started:.0f} s.")
        for engine, _ in paths.values():
            decode(engine, long_prompt[:32], max_new_tokens=2, eos_id=eos)
        if server is not None:
            _llama_cpp(server, long_prompt[:32], 2, False)
        prefill: dict[str, list[float]] = {}
        decoded: dict[str, list[float]] = {}  # [tokens after the first, seconds] summed over the prompts
        for _ in range(repeats):  # interleaved, so that a load change on the machine hits every path
            for name, (engine, speculate) in paths.items():
                fresh = decode(engine, long_prompt, max_new_tokens=1, eos_id=eos)
                prefill.setdefault(name, []).append(len(long_prompt) / fresh.prefill_s)
            for peer in hf:  # prompt lookup and compile change nothing in generate's prefill
                if not peer.speculates and "compiled" not in peer.name:
                    prefill_s, _, _ = generate(peer, long_prompt, 1, eos)
                    prefill.setdefault(peer.name, []).append(len(long_prompt) / prefill_s)
            if server is not None:  # the server's own clock, as kv_decode's
                prefill.setdefault(LLAMA_CPP, []).append(
                    len(long_prompt) / (_llama_cpp(server, long_prompt, 1, False).prompt_ms / 1000))
        for prompt in prompts:
            for name, (engine, speculate) in paths.items():
                fresh = decode(engine, prompt, max_new_tokens=new_tokens, eos_id=eos, speculate=speculate)
                _add(decoded, name, len(fresh.ids) - 1, fresh.decode_s)
            for peer in hf:
                _, decode_s, made = generate(peer, prompt, new_tokens, eos)
                _add(decoded, peer.name, len(made) - 1, decode_s)
            if server is not None:
                fresh = _llama_cpp(server, prompt, new_tokens, False)
                if len(fresh.ids) > 1 and fresh.predicted_ms > 0:  # it may end its turn at once
                    _add(decoded, LLAMA_CPP, len(fresh.ids) - 1, fresh.predicted_ms / 1000)
        print(f"embedded_generation: prefill {prefill}, decode {decoded}", file=sys.stderr, flush=True)
        # the conversation from the agent's prompt: ours chooses the replies, the others are fed the same ones
        start = prompts[0]
        ours_s, replies, prompt_tokens = _conversation(ours, start, None, turns, new_tokens, eos, tool_turn,
                                                       model.speculate)
        completion_tokens = sum(len(reply) for reply in replies)
        agent = {OURS: completion_tokens / ours_s}
        for name, (engine, speculate) in paths.items():
            if name != OURS:
                agent[name] = completion_tokens / _conversation(engine, start, replies, turns, new_tokens, eos,
                                                                tool_turn, speculate)[0]
        for peer in hf:  # every call re-read by plain generate; the others keep their cache across calls
            if peer.name == "generate":
                seconds, conversation_ids = 0.0, list(start)
                for reply in replies:
                    prefill_s, decode_s, _ = generate(peer, conversation_ids, len(reply), eos)
                    seconds += prefill_s + decode_s
                    conversation_ids = conversation_ids + reply + tool_turn
                agent[peer.name] = completion_tokens / seconds
            if "static" not in peer.name:
                label = f"{peer.name} (re-reads)" if peer.speculates else f"{peer.name} + cache"
                agent[label] = completion_tokens / conversation(peer, start, replies, tool_turn, eos)
        if server is not None:
            llama_s, llama_made = _llama_cpp_conversation(server, start, replies, tool_turn)
            agent[LLAMA_CPP] = llama_made / llama_s
    pre = {name: statistics.median(values) for name, values in prefill.items()}
    dec = {name: tokens / seconds for name, (tokens, seconds) in decoded.items()}
    rows = [
        _row(f"prefill, one fresh {len(long_prompt)}-token prompt", pre),
        _row(f"decode, greedy, {new_tokens} tokens after each of {len(prompts)} prompts that do not copy "
             "themselves (an agent's task, plain instructions)", dec),
        _row(f"agent conversation: {turns} calls, {prompt_tokens} prompt tokens in all, completion tokens per "
             "second of call time", agent),
        Row(metric="first call in a fresh process: load + a 16-token answer", unit="s", ours=first_call,
            peers={"GGUF load alone (the first call before the checkpoint cache)": load_gguf},
            ratios={"orchard/gguf": ratio(first_call, load_gguf)}),
    ]
    if first_call_llama is not None:
        rows.append(Row(metric="first call in a fresh process, ORCHARD_SMOLLM2_ENGINE=llama_cpp (runtime built)",
                        unit="s", ours=first_call_llama, peers={"configured engine": first_call},
                        ratios={"llama_cpp/configured": ratio(first_call_llama, first_call)}))
    return Findings(rows=rows, notes=[
        f"Orchard = smollm2's configured engine: {smollm2.EngineSettings.from_environment().engine} `generate`, "
        f"{str(dtype).removeprefix('torch.')} weights, prompt lookup "
        f"{'off' if not model.speculate else f'on ({model.speculate} tokens)'} (ORCHARD_SMOLLM2_SPECULATE), "
        "kv_decode.py's prefix cache across a conversation's calls. Threads: "
        f"{smollm2.generation_threads()} (ORCHARD_SMOLLM2_THREADS, else half the CPUs, at most 4).",
        "transformers peers (bench/generation_peers.py), greedy, logits of the last position only: `generate` "
        "is the float32 model with its DynamicCache; `static` passes cache_implementation=\"static\"; `lookup` "
        f"prompt_lookup_num_tokens={DRAFT_TOKENS}; `bfloat16` a bf16 copy of the model; `compiled` the static "
        "cache with a CompileConfig (inductor, fullgraph, static shapes; transformers compiles the decode "
        f"step, the prefill runs eager). {compile_note or 'No compiled peer in this run.'} "
        "`best transformers` is the fastest of them in that row. In the conversation every path is given the "
        "same prompts (Orchard's replies fed back); `+ cache` keeps one DynamicCache across the calls, cropped "
        "to the shared prefix (generate then reads only the new tokens, as Orchard's prefix cache), except with "
        "prompt lookup, which in transformers 5.24 mis-continues a filled cache (so those re-read each prompt: "
        "`(re-reads)`); plain "
        "`generate` re-reads each prompt. A static cache cannot be cropped, so it is not in the conversation.",
        f"`{LLAMA_CPP}`: the llama_cpp engine's llama-server on the Q4_1 GGUF itself, same threads, same token "
        "ids; prefill and decode from the server's own timings (no prompt cache), the conversation by wall "
        "clock through its HTTP API with its prompt cache. Inference only: its logprobs are the quantized "
        "model's; it is not a transformers configuration, so not in `best transformers`.",
        REMOVED_ENGINE,
    ])


def _add(totals: dict[str, list[float]], name: str, tokens: int, seconds: float) -> None:
    entry = totals.setdefault(name, [0.0, 0.0])
    entry[0] += tokens
    entry[1] += seconds


def _row(metric: str, figures: dict[str, float]) -> Row:
    """Orchard's figure beside every other path; the ratios against plain generate and against the best
    transformers configuration in the row."""
    hf = {name: value for name, value in figures.items() if name.startswith("generate")}
    best = max(hf, key=hf.__getitem__)
    return Row(metric=metric, unit="tokens/s", ours=figures[OURS],
               peers={name: value for name, value in figures.items() if name != OURS},
               ratios={"orchard/generate": ratio(figures[OURS], figures["generate"]),
                       f"orchard/best transformers ({best})": ratio(figures[OURS], hf[best])})


MEASUREMENT = Measurement(
    name="embedded_generation",
    title="Embedded policy generation (SmolLM2-135M, CPU)",
    method=("One process loads SmolLM2-135M once; smollm2's engine (`generate` with kv_decode.py's prefix "
            "cache) and transformers' own configurations (`generate` plain, static cache, prompt lookup, "
            "bfloat16, compiled) run interleaved on the same weights and token ids, 1 thread. Prefill: a fresh "
            "react-style prompt of ~1.3k tokens (median of 3). "
            "Decode: 48 greedy tokens after each of 4 prompts whose replies do not copy them (a react agent's "
            "task, three plain instructions), timed from the first token on (for `generate`, a logits processor "
            "notes when each token is asked for), tokens over seconds summed. Conversation: 4 calls from the "
            "agent's prompt, each prompt the previous one + the reply + a tool result. First call: a fresh "
            "process, from nothing loaded to a 16-token answer (cached checkpoint), beside the bare GGUF load."),
    run=run,
)
