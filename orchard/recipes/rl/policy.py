"""The policy being trained, served through the run's gateway (`orchard.policies.live`): transformers
generation in this process, with the trainer's current weights, **token in, token out**.

A rollout's first call renders the chat with the tokenizer's template (tools in the system prompt when the
template has none, as for smollm2). Every later call of the same rollout key is built from ids, never from
re-tokenized text: the previous call's prompt ids + the ids it sampled + the ids of what the harness added
since (the tool results, a nudge), rendered alone. So call k+1's prompt starts with exactly call k's prompt
and completion, the trainer gets the ids the policy sampled, and nothing drifts. If a harness rewrites its
history (compaction), the call starts a new segment from a fresh render (`orchard.recipes.rl.samples`
trains the consistent prefix and says so).

`forced` (optional) dictates a completion's text instead of sampling it — its ids are then scored by the
same model, so ids and logprobs are still the policy's own. Tests and demos use it to put known-good and
known-bad actions into a group (e.g. the oracle's patch); `None` samples.

On a CPU, generation is transformers' `generate` through `orchard.policies.kv_decode`'s prefix cache: a rollout's
next prompt extends its last one, so only the new tokens are read (the cache is dropped whenever the
trainer changes the weights). On a GPU, sample from a vLLM server instead: `VLLMPolicy`
(orchard.recipes.rl.vllm) is this class with its sampler sending the same prompt ids to vLLM's completions
endpoint, so token in, token out holds there too (docs/training.md)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from orchard.core.errors import InvalidRequest
from orchard.policies.chat_render import render_for_template, template_supports_tools
from orchard.policies.smollm2 import LocalCompletion, TokenLogprob, sampling_request
from orchard.policies.tool_parsing import parse_model_output

Forced = Callable[[str | None, list[dict[str, Any]], list[dict[str, Any]] | None], str | None]
DEFAULT_MAX_TOKENS = 256


@dataclass
class _RolloutTokens:
    messages: list[str]  # the messages of the last call, as JSON (to check the next call extends them)
    ids: list[int]  # the last call's prompt + completion ids
    ended: bool  # the completion ended with the end-of-turn token
    segments: int = 1


@dataclass
class TrainingPolicy:
    """`model` is read at each call (the trainer swaps in nothing: it updates this object's weights)."""

    model: Any
    tokenizer: Any
    name: str = "policy"
    forced: Forced | None = None
    end_of_turn: str = "<|im_end|>"
    _rollouts: dict[str, _RolloutTokens] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _prefixes: Any = None
    reused_prompt_tokens: int = 0  # prompt tokens whose KV states the prefix cache supplied
    samples_in_parallel = False  # class-level: True where `_sample` is a remote call that needs no lock

    def __post_init__(self) -> None:
        from orchard.policies.kv_decode import PrefixCache

        self._prefixes = PrefixCache(slots=8)
        self.end_of_turn_id = self.tokenizer.convert_tokens_to_ids(self.end_of_turn)
        self.native_tools = template_supports_tools(self.tokenizer.chat_template)

    # --- the gateway's entry point ---------------------------------------------------------------------

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 params: dict[str, Any], *, rollout_key: str | None, timeout_s: float | None) -> LocalCompletion:
        sampling = sampling_request(params)
        limit = sampling.max_completion_tokens or sampling.max_tokens or DEFAULT_MAX_TOKENS

        def sample(prompt: list[int]) -> tuple[list[int], list[float]]:
            return self._sample(prompt, sampling.temperature, sampling.top_p, limit, sampling.seed)

        ids: list[int] | None = None
        with self._lock:  # one generation at a time (CPU); the tokenizer is not thread-safe either
            state = self._rollouts.get(rollout_key) if rollout_key else None
            prompt, segments = self._prompt_ids(state, messages, tools)
            forced = self.forced(rollout_key, messages, tools) if self.forced is not None else None
            if forced is not None:
                ids = list(self.tokenizer(forced, add_special_tokens=False)["input_ids"]) + [self.end_of_turn_id]
                logprobs = self._score(prompt, ids)
            elif not self.samples_in_parallel:
                ids, logprobs = sample(prompt)
        if ids is None:  # a remote sampler (VLLMPolicy): other rollouts' calls go on meanwhile
            ids, logprobs = sample(prompt)
        with self._lock:
            ended = bool(ids) and ids[-1] == self.end_of_turn_id
            if rollout_key:
                self._rollouts[rollout_key] = _RolloutTokens(
                    messages=[_canonical(m) for m in messages], ids=prompt + ids, ended=ended, segments=segments)
            text = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        parsed = parse_model_output(text, tools)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = [call.openai(f"call_{i}_{os.urandom(6).hex()}")
                                     for i, call in enumerate(parsed.tool_calls)]
        finish = "tool_calls" if parsed.tool_calls else ("stop" if ended else "length")
        entries = [TokenLogprob(token_id=t, text=self.tokenizer.decode([t]), logprob=lp, top=[])
                   for t, lp in zip(ids, logprobs)]
        return LocalCompletion(message=message, finish_reason=finish, prompt_token_ids=prompt,
                               completion_token_ids=ids, logprobs=entries, model=self.name)

    def forget(self, rollout_key: str) -> None:
        with self._lock:
            self._rollouts.pop(rollout_key, None)

    def weights_changed(self) -> None:
        """Drop the cached KV states: they were computed with the weights before the optimizer step."""
        with self._lock:
            self._prefixes.clear()

    # --- token in, token out ---------------------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
               generation_prompt: bool) -> str:
        rendered, template_tools = render_for_template(messages, tools, native_tools=self.native_tools)
        return self.tokenizer.apply_chat_template(rendered, tools=template_tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _prompt_ids(self, state: _RolloutTokens | None, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> tuple[list[int], int]:
        """The prompt of this call and its segment number: the previous call's ids extended by the ids
        of the messages added since, or (first call, rewritten history) a fresh render."""
        seen = len(state.messages) if state else 0
        extends = (state is not None and len(messages) > seen + 1
                   and [_canonical(m) for m in messages[:seen]] == state.messages
                   and messages[seen].get("role") == "assistant")
        if extends:
            with_reply = self.render(messages[:seen + 1], tools, generation_prompt=False)
            full = self.render(messages, tools, generation_prompt=True)
            cut = with_reply.rfind(self.end_of_turn)
            if full.startswith(with_reply) and cut >= 0:
                # after the sampled ids: what the template puts after the reply's end of turn (a newline),
                # the end of turn itself if the reply was cut off, then the new messages
                separator = with_reply[cut + (len(self.end_of_turn) if state.ended else 0):]
                return state.ids + self._encode(separator + full[len(with_reply):]), state.segments
        prompt = self._encode(self.render(messages, tools, generation_prompt=True))
        return prompt, (state.segments + 1 if state else 1)

    def _sample(self, prompt: list[int], temperature: float | None, top_p: float | None, max_new_tokens: int,
                seed: int | None) -> tuple[list[int], list[float]]:
        import torch

        limit = int(getattr(self.model.config, "max_position_embeddings", 4096)) - len(prompt)
        if limit < 1:
            raise InvalidRequest(f"the prompt is {len(prompt)} tokens, more than the policy's context holds")
        sampled = bool(temperature)
        was_training = self.model.training
        self.model.eval()
        if self.model.device.type == "cpu":  # the KV-cached loop; a rollout's next prompt reuses its last one
            from orchard.policies.kv_decode import decode

            try:
                with torch.inference_mode():
                    if seed is not None:
                        torch.manual_seed(seed)
                    done = decode(self.model, prompt, max_new_tokens=min(max_new_tokens, limit),
                                  eos_id=self.end_of_turn_id, temperature=temperature if sampled else None,
                                  top_p=top_p if sampled else None, prefix_cache=self._prefixes)
            finally:
                self.model.train(was_training)
            self.reused_prompt_tokens += done.reused_prefix
            return done.ids, done.logprobs
        try:
            with torch.no_grad():
                if seed is not None:
                    torch.manual_seed(seed)
                input_ids = torch.tensor([prompt], device=self.model.device)
                output = self.model.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=min(max_new_tokens, limit), do_sample=sampled,
                    temperature=temperature if sampled else None, top_p=top_p if sampled else None, top_k=None,
                    eos_token_id=self.end_of_turn_id, pad_token_id=self.end_of_turn_id,
                    output_logits=True, return_dict_in_generate=True)
        finally:
            self.model.train(was_training)
        ids = output.sequences[0, len(prompt):].tolist()
        logprobs = [float(torch.log_softmax(step[0].float(), dim=-1)[token])
                    for step, token in zip(output.logits, ids)]
        return ids, logprobs

    def _score(self, prompt: list[int], ids: list[int]) -> list[float]:
        """The model's logprob of each of `ids` after `prompt` (for a dictated completion)."""
        import torch

        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([prompt + ids], device=self.model.device)).logits[0]
        finally:
            self.model.train(was_training)
        distribution = torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1)
        chosen = torch.tensor(ids, device=distribution.device).unsqueeze(1)
        return distribution.gather(1, chosen).squeeze(1).tolist()


def _canonical(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, default=str)
