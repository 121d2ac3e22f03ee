"""Generation for a transformers causal LM through transformers' own `generate`, with a prefix cache across
calls and the per-token logprobs a trajectory records.

`generate` keeps a KV cache within a call; what it costs across calls is re-reading the whole conversation:
an agent's next prompt is its last prompt + its reply + a tool result. `PrefixCache` keeps the caches of the
last few conversations (the prompt and the completion tokens fed back) and a call hands `generate` the one
sharing the longest token prefix, cropped to it, so `generate` reads only the new tokens (a cache passed in
is what `generate` continues from).

Everything else is `generate`'s: the token choice (greedy, or its temperature / top-k / top-p warpers and
`torch.multinomial` on torch's global generator, so a seed gives `generate`'s tokens), prompt-lookup
speculation (`prompt_lookup_num_tokens`, greedy only; such a call reads its whole prompt, as transformers'
prompt lookup does not continue a filled cache correctly), the end-of-turn id, `max_new_tokens` and stop
strings (a transformers `StopStringCriteria`). Here: the logprob of each token (and the top-k) from one
float32 log-softmax of the raw logits `generate` returns (`output_logits`), and a deadline.

A hand-written forward pass and decode loop (lean_llama.py) used to run here; beside transformers' best
configuration in the same bench run it was not 1.5x faster (docs/BENCHMARKS.md §12), so it was removed.

Numerics: a fresh call is `generate`; a reused prefix was computed in other chunk sizes: its logprobs agree
to float rounding (~1e-5), as with vLLM's prefix caching."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PREFIX_SLOTS = 4


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


@dataclass
class _Slot:
    ids: list[int]
    cache: Any  # a transformers DynamicCache holding the KV states of `ids`


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
            slot.cache.crop(-excess)  # transformers crops by a negative count
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


class _Clock:
    """A logits processor that changes nothing and notes when the first token is chosen (the end of the
    prefill), and a stopping criterion for the deadline."""

    def __init__(self, deadline: float | None) -> None:
        self.first: float | None = None
        self.deadline = deadline
        self.expired = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.first is None:
            self.first = time.perf_counter()
        return scores

    def stop(self, input_ids: Any, scores: Any, **_: Any) -> Any:
        import torch

        if self.deadline is not None and time.monotonic() > self.deadline:
            self.expired = True
        return torch.full((input_ids.shape[0],), self.expired, dtype=torch.bool)


def decode(model: Any, prompt: list[int], *, max_new_tokens: int, eos_id: int, temperature: float | None = None,
           top_k: int | None = None, top_p: float | None = None, top_logprobs: int = 0, stop_criteria: Any = None,
           deadline: float | None = None, prefix_cache: PrefixCache | None = None,
           speculate: int = 0) -> DecodeResult:
    """Generate up to `max_new_tokens` after `prompt` with `model.generate` (greedy unless `temperature` > 0;
    sampling keeps the `top_k` best tokens, none dropped when None, then `top_p`). Call under
    `torch.inference_mode()` with the thread count wanted. `stop_criteria`: a transformers StoppingCriteria
    (e.g. StopStringCriteria); `deadline`: a `time.monotonic()` value after which generation stops with
    `expired` set; `speculate`: prompt-lookup draft tokens (`prompt_lookup_num_tokens`), greedy calls only,
    0 for none."""
    import torch
    import transformers

    started = time.perf_counter()
    sampled = bool(temperature)
    speculating = speculate > 0 and not sampled
    # transformers 5.24's prompt lookup mis-continues a cache that already holds part of the prompt (its
    # tokens after the first differ from plain decoding's): a speculative call starts from an empty cache
    cache, reused = prefix_cache.take(prompt) if prefix_cache is not None and not speculating else (None, 0)
    if cache is None:
        cache = transformers.DynamicCache(config=model.config)
    config = transformers.GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=sampled, temperature=temperature if sampled else None,
        top_k=(top_k or 0) if sampled else None, top_p=top_p if sampled else None,
        eos_token_id=eos_id, pad_token_id=eos_id, output_logits=True, return_dict_in_generate=True,
        prompt_lookup_num_tokens=speculate if speculating else None)
    clock = _Clock(deadline)
    criteria = transformers.StoppingCriteriaList([clock.stop] + ([stop_criteria] if stop_criteria is not None else []))
    input_ids = torch.tensor([prompt])
    output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                            cache=cache, logits_processor=transformers.LogitsProcessorList([clock]),
                            stopping_criteria=criteria)
    ended = time.perf_counter()
    ids = output.sequences[0, len(prompt):].tolist()
    logprobs: list[float] = []
    tops: list[list[tuple[int, float]]] = []
    for step_logits, token in zip(output.logits, ids):
        distribution = torch.log_softmax(step_logits[0].float(), dim=-1)
        logprobs.append(float(distribution[token]))
        if top_logprobs:
            values, indices = distribution.topk(top_logprobs)
            tops.append(list(zip(indices.tolist(), values.tolist())))
        else:
            tops.append([])
    if prefix_cache is not None:  # the last token was never fed: the cache holds prompt + ids[:-1]
        prefix_cache.put((prompt + ids)[:cache.get_seq_length()], cache)
    first = clock.first or ended
    return DecodeResult(ids=ids, logprobs=logprobs, top=tops, reused_prefix=reused, expired=clock.expired,
                        hit_limit=len(ids) >= max_new_tokens and ids[-1] != eos_id,
                        prefill_s=first - started, decode_s=ended - first)
