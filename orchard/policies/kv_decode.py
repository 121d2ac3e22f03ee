"""A KV-cached decode loop for a causal LM on CPU, with the sampling semantics of transformers' `generate`
and a prefix cache across calls.

`generate` already keeps a KV cache; what it costs per call here is re-reading the whole conversation:
an agent's next prompt is its last prompt + its reply + a tool result, and each call prefills all of it
again. `PrefixCache` keeps the KV states of the last few conversations (the prompt and the completion
tokens fed back) and a call reuses the longest common token prefix, so only the new tokens are read.

Per token the loop does one forward of one token (`logits_to_keep=1`), one log-softmax of the raw logits
(the token's logprob and the top-k, as the recorded trajectory needs), and the token choice exactly as
`generate` makes it: argmax of the raw logits when greedy; else the same transformers warpers
(temperature, top-k, top-p, in its order) on the logits, softmax, and `torch.multinomial` on torch's
global generator, so a seed gives the same tokens as `generate` with that seed. Greedy calls with `speculate`
on a model with `verify` (lean_llama.LeanLlama) feed prompt-lookup drafts (prompt_lookup.py) and the current
token in one forward pass and keep the drafts the model's argmax confirms, token by token: the same ids as
one token per pass where the many-row pass rounds as the one-row pass does (float32; not bfloat16), fewer passes where the reply copies its context. Stop conditions are `generate`'s: the
end-of-turn id, `max_new_tokens`, stop strings through transformers' `StopStringCriteria`, and a
deadline.

The model is a transformers causal LM or anything called the same way that makes its own cache
(`new_cache()`: lean_llama.LeanLlama, smollm2's default engine).

Numerics (for a transformers model): a fresh call (no reused prefix) runs the same forwards as `generate` and gives the same ids and
logprobs. A reused prefix was computed in other chunk sizes: its logprobs agree to float rounding (~1e-5),
as with vLLM's prefix caching."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from orchard.policies.prompt_lookup import draft

DEFAULT_PREFIX_SLOTS = 4
MAX_PAUSE = 32  # the most one-token steps speculation sits out after drafts the model turned down


@dataclass
class DecodeResult:
    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]  # per token: the top-k (token id, logprob), empty when k == 0
    hit_limit: bool
    expired: bool
    reused_prefix: int  # prompt tokens whose KV states came from the prefix cache
    prefill_s: float = 0.0
    decode_s: float = 0.0
    drafted: int = 0  # prompt-lookup draft tokens verified (speculative decoding)
    accepted: int = 0  # of them, the ones the model chose itself (emitted without a forward pass of their own)


@dataclass
class _Slot:
    ids: list[int]
    cache: Any  # transformers DynamicCache holding the KV states of `ids`


@dataclass
class PrefixCache:
    """The KV states of the last `slots` conversations, most recently used last."""

    slots: int = DEFAULT_PREFIX_SLOTS
    _entries: OrderedDict[int, _Slot] = field(default_factory=OrderedDict)
    _next_key: int = 0

    def take(self, prompt: list[int]) -> tuple[Any | None, int]:
        """The cache whose ids share the longest prefix with `prompt` (removed from the pool: the call
        extends it) cropped to that prefix, and the prefix's length; (None, 0) when nothing is shared. At
        least one prompt token is always left to feed, so the call has logits to start from."""
        best_key, best = None, 0
        for key, slot in self._entries.items():
            shared = _common_prefix(slot.ids, prompt, limit=len(prompt) - 1)
            if shared > best:
                best_key, best = key, shared
        if best_key is None:
            return None, 0
        slot = self._entries.pop(best_key)
        excess = len(slot.ids) - best
        if excess:
            slot.cache.crop(-excess)
        return slot.cache, best

    def put(self, ids: list[int], cache: Any) -> None:
        if self.slots < 1:
            return
        self._entries[self._next_key] = _Slot(ids=list(ids), cache=cache)
        self._next_key += 1
        while len(self._entries) > self.slots:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


def _common_prefix(a: list[int], b: list[int], *, limit: int) -> int:
    n = 0
    for x, y in zip(a, b):
        if n >= limit or x != y:
            break
        n += 1
    return n


def decode(model: Any, prompt: list[int], *, max_new_tokens: int, eos_id: int, temperature: float | None = None,
           top_k: int | None = None, top_p: float | None = None, top_logprobs: int = 0, stop_criteria: Any = None,
           deadline: float | None = None, prefix_cache: PrefixCache | None = None,
           speculate: int = 0) -> DecodeResult:
    """Generate up to `max_new_tokens` after `prompt` (greedy unless `temperature` > 0). Call under
    `torch.inference_mode()` with the thread count wanted. `stop_criteria`: a transformers
    StoppingCriteria (e.g. StopStringCriteria) called as `generate` calls it; `deadline`: a
    `time.monotonic()` value after which generation stops with `expired` set; `speculate`: the most
    prompt-lookup draft tokens verified per forward pass (prompt_lookup.py), 0 for none. Speculation is
    greedy only and needs a model with `verify` (lean_llama.LeanLlama); it emits the tokens one-token
    decoding emits (each draft token is kept only where the model's own argmax is that token)."""
    import torch
    import transformers

    processors = transformers.LogitsProcessorList()
    if temperature:
        if temperature != 1.0:
            processors.append(transformers.TemperatureLogitsWarper(temperature))
        if top_k:
            processors.append(transformers.TopKLogitsWarper(top_k))
        if top_p is not None and top_p < 1.0:
            processors.append(transformers.TopPLogitsWarper(top_p))

    started = time.perf_counter()
    drafted = kept = 0
    cache, reused = prefix_cache.take(prompt) if prefix_cache is not None else (None, 0)
    if cache is None:  # a model with its own cache type (lean_llama.LeanLlama) makes it
        cache = model.new_cache() if hasattr(model, "new_cache") else transformers.DynamicCache(config=model.config)
    new = torch.tensor([prompt[reused:]])
    logits = model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()
    prefill_s = time.perf_counter() - started

    sequence = torch.tensor([prompt])  # only materialised for stop strings, which read the tail
    ids: list[int] = []
    logprobs: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    expired = False

    def emit(logits: Any) -> bool:
        """Choose the next token from `logits`, record it; whether generation ends with it."""
        nonlocal sequence, expired
        distribution = torch.log_softmax(logits, dim=-1)
        if temperature:
            scores = processors(sequence, logits[None])
            token = int(torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[0, 0])
        else:
            token = int(torch.argmax(logits))
        ids.append(token)
        logprobs.append(float(distribution[token]))
        if top_logprobs:
            values, indices = distribution.topk(top_logprobs)
            tops.append(list(zip(indices.tolist(), values.tolist())))
        else:
            tops.append([])
        if stop_criteria is not None or processors:
            sequence = torch.cat([sequence, torch.tensor([[token]])], dim=-1)
        if token == eos_id or len(ids) >= max_new_tokens:
            return True
        if stop_criteria is not None and bool(stop_criteria(sequence, None)[0]):
            return True
        if deadline is not None and time.monotonic() > deadline:
            expired = True
            return True
        return False

    # exact prompt-lookup speculation: greedy only, and only for a model that verifies several positions at once
    speculating = speculate > 0 and not temperature and hasattr(model, "verify")
    # a verification that accepts nothing costs ~1.6 one-token steps (bf16 SmolLM2): after a miss, the next
    # `pause` steps (4, doubling with each miss in a row) draft nothing, so text that copies nothing pays little
    pause = wait = 0
    done = emit(logits)
    while not done:
        token = ids[-1]
        guess = []
        if speculating and wait:
            wait -= 1
        elif speculating:
            guess = draft(prompt + ids, tokens=min(speculate, max_new_tokens - len(ids)))
        if not guess:
            logits = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1].float()
            done = emit(logits)
            continue
        fed = cache.get_seq_length()
        rows = model.verify(input_ids=torch.tensor([[token] + guess]), cache=cache)  # [1 + len(guess), vocab]
        accepted = 0  # draft tokens the model chose itself: their positions stay in the cache
        for row in range(len(guess) + 1):
            done = emit(rows[row])
            if done or row == len(guess) or ids[-1] != guess[row]:
                break
            accepted += 1
        drafted += len(guess)
        kept += accepted
        pause = 0 if accepted else min(2 * pause or 4, MAX_PAUSE)
        wait = pause
        cache.crop(fed + 1 + accepted)  # the rejected positions go; the last emitted token is not fed yet
    if prefix_cache is not None:  # the last token was never fed: the cache holds prompt + ids[:-1]
        prefix_cache.put(prompt + ids[:-1], cache)
    hit_limit = len(ids) >= max_new_tokens and ids[-1] != eos_id
    return DecodeResult(ids=ids, logprobs=logprobs, top=tops, hit_limit=hit_limit, expired=expired,
                        reused_prefix=reused, prefill_s=prefill_s, drafted=drafted, accepted=kept,
                        decode_s=time.perf_counter() - started - prefill_s)
