"""The transformers configurations bench/embedded_generation.py sets smollm2's engine beside: `generate` plain,
with a static cache, with prompt lookup (`prompt_lookup_num_tokens`), in bfloat16, and with `torch.compile`
where it works; and the prompts to measure decoding on, which do not copy themselves (a reply copied from
its prompt is what prompt lookup drafts, so a copying prompt flatters every speculating path)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

DRAFT_TOKENS = 8  # prompt lookup's draft length (prompt_lookup_num_tokens) for the speculating peers

# A react-style task whose answer is new text: nothing in it repeats, so the reply has little to copy
AGENT_TASK = ("The service in /testbed/app.py answers some requests with HTTP 500 when two clients upload a "
              "file of the same name at once. Find out why, explain the cause in a short paragraph, then fix it "
              "so that concurrent uploads never overwrite each other and every client gets its own file back.")
PLAIN_INSTRUCTIONS = ("Write a short story about a fox who learns to swim.",
                      "Explain in a few sentences how a hash table finds a key.",
                      "Give three tips for writing a clear commit message.")


@dataclass
class Peer:
    """One transformers configuration: its model (the float32 one or a bfloat16 copy) and generate's kwargs."""

    name: str
    model: Any
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def speculates(self) -> bool:
        return "prompt_lookup_num_tokens" in self.kwargs


def peers(model: Any, bf16: bool, compile_peer: bool, max_cache_len: int) -> list[Peer]:
    """transformers' own configurations, float32 and (where the CPU computes bf16 natively) bfloat16; with
    `compile_peer`, the static cache's decode step compiled by `torch.compile` (inductor) too. Static caches
    are sized `max_cache_len` once (transformers keeps a model's static cache across calls and grows it to
    the longest seen; one size also means one compiled graph)."""
    import torch
    import transformers

    models = {"float32": model}
    found = [Peer("generate", model)]
    if bf16:
        models["bfloat16"] = copy.deepcopy(model).to(torch.bfloat16).eval()
        found.append(Peer("generate bfloat16", models["bfloat16"]))
    for dtype, weights in models.items():
        found.append(Peer(f"generate static {dtype}", weights, {"cache_implementation": "static",
                                                                 "max_cache_len": max_cache_len}))
        found.append(Peer(f"generate lookup {dtype}", weights, {"prompt_lookup_num_tokens": DRAFT_TOKENS}))
    if compile_peer:
        config = transformers.CompileConfig(fullgraph=True, dynamic=False, mode="default")
        config._compile_all_devices = True  # transformers compiles on CPU only when told to
        # float32: compiled in bf16 the decode step ran at half eager bf16's speed on the bench's Xeon
        found.append(Peer("generate static compiled float32", model,
                          {"cache_implementation": "static", "max_cache_len": max_cache_len,
                           "compile_config": config}))
    return found


class StepClock:
    """A logits processor that only notes when `generate` asks for a token: the first call comes right after
    the prefill, so one generate call gives both its prefill and its decode time."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.times.append(time.perf_counter())
        return scores


def generate(peer: Peer, prompt: list[int], new_tokens: int, eos_id: int,
             cache: Any = None) -> tuple[float, float, list[int]]:
    """Greedy `generate` with `peer`'s configuration: (prefill seconds, decode seconds after the first token,
    the tokens made). `cache`: a transformers cache holding a prefix of `prompt` (generate reads the rest)."""
    import torch
    import transformers

    ids = torch.tensor([prompt])
    clock = StepClock()
    extra = dict(peer.kwargs)
    if cache is not None:
        extra["cache"] = cache
    started = time.perf_counter()
    output = peer.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False, top_k=None, top_p=None, temperature=None, eos_token_id=eos_id,
                                 pad_token_id=eos_id, logits_processor=transformers.LogitsProcessorList([clock]),
                                 **extra)
    ended = time.perf_counter()
    return clock.times[0] - started, ended - clock.times[0], output[0, len(prompt):].tolist()


def conversation(peer: Peer, prompt: list[int], replies: list[list[int]], tool_turn: list[int],
                 eos_id: int) -> float:
    """Seconds of call time for an agent's calls through `generate`, keeping one DynamicCache across them (as
    smollm2's prefix cache does; not with prompt lookup, see below): each prompt is the last one + the given
    reply + `tool_turn`, and the cache is cropped to what the new prompt shares with what it holds, so each
    call reads only the new tokens. Each call makes as many tokens as the given reply (or stops at its end
    of turn)."""
    import transformers

    cache = transformers.DynamicCache(config=peer.model.config)
    held: list[int] = []  # the ids whose states `cache` holds
    conversation_ids, seconds = list(prompt), 0.0
    for reply in replies:
        shared = 0
        for a, b in zip(held, conversation_ids[:-1]):
            if a != b:
                break
            shared += 1
        if shared < cache.get_seq_length():
            cache.crop(shared - cache.get_seq_length())  # transformers crops by a negative count only
        started = time.perf_counter()
        # transformers 5.24's prompt lookup mis-continues a cache that already holds a prefix: it re-reads
        _, _, made = generate(peer, conversation_ids, len(reply), eos_id, cache=None if peer.speculates else cache)
        seconds += time.perf_counter() - started
        held = (conversation_ids + made)[:cache.get_seq_length()]
        conversation_ids = conversation_ids + reply + tool_turn
    return seconds


def agent_messages(task_text: str = AGENT_TASK) -> list[dict[str, Any]]:
    from orchard.harnesses.react.prompts import DEFAULT_INSTANCE_TEMPLATE, DEFAULT_SYSTEM_TEMPLATE, render

    variables = {"instruction": task_text, "workdir": "/testbed", "task_id": "bench"}
    return [{"role": "system", "content": render(DEFAULT_SYSTEM_TEMPLATE, **variables)},
            {"role": "user", "content": render(DEFAULT_INSTANCE_TEMPLATE, **variables)}]


def decode_prompts(model: Any) -> list[list[int]]:
    """The prompts decoding is measured on: the react-style agent prompt, then the plain instructions."""
    return [model.prompt_ids(agent_messages(), None)] + [
        model.prompt_ids([{"role": "user", "content": text}], None) for text in PLAIN_INSTRUCTIONS]
