"""A lean forward pass for a Llama-architecture causal LM (SmolLM2 is one) on CPU, for generation only.

transformers' eager model spends most of a one-token decode step around its matrix products: per layer a
dozen small ops, a `torch.cat` that copies the whole KV cache on every token, an attention call sized for
long queries. Here the same weights run with:

- the query/key/value projections fused into one matrix and gate/up into another (two matrix-vector
  products fewer per layer);
- a KV cache preallocated per conversation and written in place (`LeanCache`, grown by doubling; `crop`
  as transformers' `DynamicCache`, so kv_decode.py's prefix cache keeps working);
- one-token attention as two small batched products over the cached keys and values (grouped-query heads
  share their key/value head without copies), causal SDPA for a prompt chunk;
- the layers' weights in `dtype`: bfloat16 halves the bytes they cost per token and uses the CPU's bf16
  units (AMX, AVX512-BF16) for prompts, where plain float32 cannot; the residual stream, the norms, the
  rotary embedding, one-token attention, the KV cache and the output projection (logits) stay float32;
  a prompt chunk's attention, most of its reading time, runs in `dtype` too.

With `dtype=torch.float32` it computes what the transformers model computes (logprobs agree to ~1e-5,
greedy ids match: tests/test_lean_llama.py). With bfloat16 a logprob moves by up to ~0.1 and a greedy
choice between two nearly tied tokens can flip: bf16's precision, as when serving the model in bf16.

It holds the weights as they were when it was built (copies, or the model's own tensors where no cast or
fusion was needed): after the weights change (an RL step), build it again (`LeanLlama(model, dtype)`;
~0.3 s for 135M parameters, a cast and two concatenations per layer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED = ("LlamaForCausalLM",)
_INITIAL_CAPACITY = 256


class UnsupportedModel(ValueError):
    """The model is not of an architecture this forward pass implements."""


@dataclass
class LeanOutput:
    logits: torch.Tensor  # [1, 1, vocab], float32: the last position's


class LeanCache:
    """The keys and values of one conversation: [layers, kv_heads, capacity, head_dim] each, the first
    `length` positions filled."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int) -> None:
        self._shape = (layers, kv_heads, head_dim)
        self.length = 0
        self.keys = torch.empty(0)
        self.values = torch.empty(0)
        self._allocate(_INITIAL_CAPACITY)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def _allocate(self, capacity: int) -> None:
        layers, heads, dim = self._shape
        keys = torch.empty(layers, heads, capacity, dim)
        values = torch.empty(layers, heads, capacity, dim)
        if self.length:
            keys[:, :, :self.length] = self.keys[:, :, :self.length]
            values[:, :, :self.length] = self.values[:, :, :self.length]
        self.keys, self.values = keys, values

    def reserve(self, extra: int) -> None:
        needed = self.length + extra
        if needed > self.capacity:
            self._allocate(max(needed, 2 * self.capacity))

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions; a negative value drops that many from the end
        (transformers' DynamicCache.crop)."""
        self.length = self.length + max_length if max_length < 0 else min(self.length, max_length)


class LeanLlama:
    """Callable like the transformers model in kv_decode.py: `model(input_ids=..., cache=..., ...)` gives
    `.logits` of the last position; `new_cache()` makes the cache it fills."""

    def __init__(self, model: Any, dtype: torch.dtype = torch.bfloat16) -> None:
        architectures = type(model).__name__
        if architectures not in SUPPORTED:
            raise UnsupportedModel(f"the lean forward pass implements {', '.join(SUPPORTED)}, not "
                                   f"{architectures}; use the transformers engine for it")
        config = model.config
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False) or \
                getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModel("the lean forward pass implements Llama without biases and with SiLU; "
                                   "use the transformers engine for this model")
        self.config = config
        self.dtype = dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        self.context_length = int(config.max_position_embeddings)
        with torch.no_grad():
            inner = model.model
            self.embedding = inner.embed_tokens.weight.detach().float()
            self.layers = [_Layer.of(layer, dtype) for layer in inner.layers]
            self.norm = inner.norm.weight.detach().float()
            # float32 even in bf16: the logits' error would be bf16's ~0.4% of each logit (a flipped
            # first token on a question as plain as the capital of France); tied weights share the embedding's
            self.lm_head = model.lm_head.weight.detach().float()
            positions = torch.arange(self.context_length)[None]
            cos, sin = inner.rotary_emb(self.embedding[:1], positions)
            self.cos, self.sin = cos[0].float().contiguous(), sin[0].float().contiguous()

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.head_dim)

    def __call__(self, *, input_ids: torch.Tensor, cache: LeanCache, **_: Any) -> LeanOutput:
        """Read `input_ids` [1, T] after the cached positions; the logits of the last one. The last token always
        goes through the one-token path, as it would after a prefix-cache hit: the same request then gives
        the same bits whether its prompt was read whole or all but its last token came from the cache."""
        ids = input_ids[0]
        if ids.shape[0] > 1:
            self._forward(ids[:-1], cache)
        hidden = self._forward(ids[-1:], cache)
        last = F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.eps)
        return LeanOutput(logits=_project(last, self.lm_head)[None])

    def _forward(self, ids: torch.Tensor, cache: LeanCache) -> torch.Tensor:
        count, start = ids.shape[0], cache.length
        if start + count > self.context_length:
            raise ValueError(f"{start + count} positions exceed the model's context of {self.context_length}")
        cache.reserve(count)
        hidden = self.embedding[ids]  # [T, hidden], float32
        cos, sin = self.cos[start:start + count], self.sin[start:start + count]
        mask = None
        if count > 1 and start:  # a chunk after cached positions: position i sees keys 0 .. start + i
            mask = torch.ones(count, start + count, dtype=torch.bool).tril(diagonal=start)
        for index, layer in enumerate(self.layers):
            hidden = hidden + self._attention(layer, index, hidden, cache, start, cos, sin, mask)
            hidden = hidden + layer.mlp(F.rms_norm(hidden, (hidden.shape[-1],), layer.post_norm, self.eps), self.dtype)
        cache.length = start + count
        return hidden

    def _attention(self, layer: "_Layer", index: int, hidden: torch.Tensor, cache: LeanCache, start: int,
                   cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        count, dim = hidden.shape[0], self.head_dim
        x = F.rms_norm(hidden, (hidden.shape[-1],), layer.input_norm, self.eps).to(self.dtype)
        qkv = _project(x, layer.qkv).float()
        q_size, kv_size = self.heads * dim, self.kv_heads * dim
        q = _rotate(qkv[:, :q_size].view(count, self.heads, dim), cos, sin)
        k = _rotate(qkv[:, q_size:q_size + kv_size].view(count, self.kv_heads, dim), cos, sin)
        v = qkv[:, q_size + kv_size:].view(count, self.kv_heads, dim)
        end = start + count
        cache.keys[index, :, start:end] = k.transpose(0, 1)
        cache.values[index, :, start:end] = v.transpose(0, 1)
        keys, values = cache.keys[index, :, :end], cache.values[index, :, :end]  # [kv, L, d]
        group = self.heads // self.kv_heads
        if count == 1:  # one query per head: [kv, group, d] x [kv, d, L]
            query = q[0].view(self.kv_heads, group, dim)
            scores = torch.bmm(query, keys.transpose(1, 2)) * self.scale
            out = torch.bmm(torch.softmax(scores, dim=-1), values)  # [kv, group, d]
            out = out.reshape(1, self.heads * dim)
        else:
            # a prompt chunk's attention is most of its reading time: in the weights' dtype (AMX for bf16)
            query = q.transpose(0, 1)[None].to(self.dtype)  # [1, heads, T, d]
            out = F.scaled_dot_product_attention(query, keys[None].to(self.dtype), values[None].to(self.dtype),
                                                 attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                                 enable_gqa=True)
            out = out[0].transpose(0, 1).reshape(count, self.heads * dim)
        return _project(out.to(self.dtype), layer.o_proj).float()


def _project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T. One row: torch.mv, whose bf16 kernel reads the weights ~1.4x faster than the matrix
    product's; more rows: the matrix product (AMX/AVX512-BF16 tiles for bf16)."""
    if x.shape[0] == 1:
        return torch.mv(weight, x[0])[None]
    return F.linear(x, weight)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as transformers' Llama applies it: x * cos + rotate_half(x) * sin; x [T, heads, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def of(cls, layer: Any, dtype: torch.dtype) -> "_Layer":
        attention, mlp = layer.self_attn, layer.mlp
        weight = lambda module: module.weight.detach()  # noqa: E731
        return cls(input_norm=weight(layer.input_layernorm).float(),
                   qkv=torch.cat([weight(attention.q_proj), weight(attention.k_proj),
                                  weight(attention.v_proj)]).to(dtype).contiguous(),
                   o_proj=weight(attention.o_proj).to(dtype).contiguous(),
                   post_norm=weight(layer.post_attention_layernorm).float(),
                   gate_up=torch.cat([weight(mlp.gate_proj), weight(mlp.up_proj)]).to(dtype).contiguous(),
                   down=weight(mlp.down_proj).to(dtype).contiguous())

    def mlp(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        gate, up = _project(x.to(dtype), self.gate_up).chunk(2, dim=-1)
        return _project(F.silu(gate) * up, self.down).float()
