"""How smollm2 generates: the engine and dtype asked for in the environment, the CPU threads it may use,
and llama-server for the `llama_cpp` engine."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard.core.errors import ModelError, first_problem


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


@contextmanager
def torch_threads(torch, threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def start_llama_server(gguf: Path, context: int) -> Any:
    """llama-server on `gguf`, its runtime built first if needed (a progress line on stderr)."""
    import sys

    from orchard.policies.llama_cpp_engine import LlamaServer
    from orchard.policies.llama_cpp_runtime import ensure_runtime

    runtime = ensure_runtime(progress=lambda line: print(f"smollm2: {line}", file=sys.stderr, flush=True))
    return LlamaServer(runtime, gguf, threads=generation_threads(), context=context)
