"""A tiny random Llama built from a config (no download), SmolLM2-shaped: grouped-query heads, tied
embeddings, weights wide enough that the next token is rarely a near tie. For the engine tests."""

from __future__ import annotations

from typing import Any


def random_llama(vocab_size: int) -> Any:
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, rope_theta=100000.0, tie_word_embeddings=True,
        initializer_range=0.2)
    torch.manual_seed(3)
    return transformers.LlamaForCausalLM(config).float().eval()
