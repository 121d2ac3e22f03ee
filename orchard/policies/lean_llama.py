"""A lean forward pass for a Llama-architecture causal LM (SmolLM2 is one) on CPU, for generation only.

transformers' eager model spends most of a one-token decode step around its matrix products: per layer a
dozen small ops, a `torch.cat` that copies the whole KV cache on every token, an attention call sized for
long queries. Here the same weights run with:

- the query/key/value projections fused into one matrix and gate/up into another (two matrix products
  fewer per layer), the MLP's SiLU and product in place;
- the rotary embedding as one complex multiplication over the queries and keys together: the query and key
  rows of each head are stored with their two rotated halves interleaved (dimension i beside i + d/2), a
  permutation of both sides of every query-key dot product, so attention computes the same scores;
- a KV cache preallocated per conversation and written in place (`LeanCache`, grown by doubling, room for
  the whole request reserved up front; `crop` as transformers' `DynamicCache`, so kv_decode.py's prefix
  cache keeps working), in `dtype`;
- attention as `scaled_dot_product_attention` over the cache (grouped-query heads share their key/value
  head without copies): causal for a prompt chunk, one query for a decode step;
- the layers' weights in `dtype`: bfloat16 halves the bytes they cost per token and uses the CPU's bf16
  units (AMX, AVX512-BF16) for prompts, where plain float32 cannot; the residual stream, the norms (written
  in `dtype` for the products they feed) and the rotary embedding are computed in float32;
- the output projection (logits) of the last position only: in float32 for `dtype=float32`; in bfloat16
  the whole vocabulary is scored with bf16 weights (a third of float32's time per token), then the
  `REFINED` best-scored tokens are scored again in float32 and replace their bf16 logits, so the greedy
  choice and the likely tokens' logits are float32's (a bf16 logit is off by up to ~0.1 at SmolLM2's
  logit sizes, enough to flip a first token as plain as the capital of France).

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
_DECODE_HEADROOM = 256  # positions reserved past a request's prompt, so that decoding rarely grows the cache
REFINED = 64  # bf16 logits: how many of the best-scored tokens are scored again in float32


class UnsupportedModel(ValueError):
    """The model is not of an architecture this forward pass implements."""


@dataclass
class LeanOutput:
    logits: torch.Tensor  # [1, 1, vocab], float32: the last position's


class LeanCache:
    """The keys and values of one conversation: [layers, kv_heads, capacity, head_dim] each, in the weights'
    dtype, the first `length` positions filled. The keys' head dimensions are in the interleaved order of
    LeanLlama's query/key rows."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32) -> None:
        self._shape = (layers, kv_heads, head_dim)
        self.dtype = dtype
        self.length = 0
        self.keys = torch.empty(0, dtype=dtype)
        self.values = torch.empty(0, dtype=dtype)
        self._allocate(_INITIAL_CAPACITY)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def _allocate(self, capacity: int) -> None:
        layers, heads, dim = self._shape
        keys = torch.empty(layers, heads, capacity, dim, dtype=self.dtype)
        values = torch.empty(layers, heads, capacity, dim, dtype=self.dtype)
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
        half = self.head_dim // 2
        with torch.no_grad():
            inner = model.model
            positions = torch.arange(self.context_length)[None]
            cos, sin = inner.rotary_emb(inner.embed_tokens.weight[:1].float(), positions)
            cos, sin = cos[0].float(), sin[0].float()
            if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
                raise UnsupportedModel("the lean forward pass implements rotary embeddings that turn dimensions "
                                       "i and i + head_dim/2 by the same angle (Llama's rotate_half); use the "
                                       "transformers engine for this model")
            # position p turns the pair (x[i], x[i + d/2]) by its angle: one complex factor per pair
            self.rotation = torch.complex(cos[:, :half].contiguous(), sin[:, :half].contiguous())
            self.embedding = inner.embed_tokens.weight.detach().float()
            self.layers = [_Layer.of(layer, dtype, self.heads, self.kv_heads, self.head_dim) for layer in inner.layers]
            self.norm = inner.norm.weight.detach().float()
            # tied weights share the embedding's; float32 is kept for the refinement (and is all of it in float32)
            self.lm_head = model.lm_head.weight.detach().float()
            self.lm_head_low = self.lm_head.to(dtype) if dtype != torch.float32 else None

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype)

    def __call__(self, *, input_ids: torch.Tensor, cache: LeanCache, **_: Any) -> LeanOutput:
        """Read `input_ids` [1, T] after the cached positions; the logits of the last one. The last token always
        goes through the one-token path, as it would after a prefix-cache hit: the same request then gives
        the same bits whether its prompt was read whole or all but its last token came from the cache."""
        ids = input_ids[0]
        if ids.shape[0] > 1:
            cache.reserve(ids.shape[0] + _DECODE_HEADROOM)
            self._forward(ids[:-1], cache)
        hidden = self._forward(ids[-1:], cache)
        return LeanOutput(logits=self._logits(F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.eps))[None])

    def verify(self, *, input_ids: torch.Tensor, cache: LeanCache) -> torch.Tensor:
        """Read `input_ids` [1, T] after the cached positions in one pass; the float32 logits of every one of
        them [T, vocab] (speculative decoding's verification: kv_decode.py crops the cache back past
        rejected positions)."""
        hidden = self._forward(input_ids[0], cache)
        return self._logits(F.rms_norm(hidden, (hidden.shape[-1],), self.norm, self.eps))

    def _logits(self, last: torch.Tensor) -> torch.Tensor:
        """[T, vocab] float32 logits of the final-normed hidden states `last` [T, hidden]."""
        if self.lm_head_low is None:
            return _project(last, self.lm_head)
        if last.shape[0] > 1:  # each row as the one-row path scores it: bf16 for all, float32 for its best
            logits = F.linear(last.to(self.dtype), self.lm_head_low).float()
            best = logits.topk(min(REFINED, logits.shape[1]), dim=-1).indices  # [T, REFINED]
            exact = torch.einsum("tkh,th->tk", self.lm_head[best], last)
            return logits.scatter_(1, best, exact)
        logits = torch.mv(self.lm_head_low, last[0].to(self.dtype)).float()
        best = logits.topk(min(REFINED, logits.shape[0])).indices
        logits[best] = torch.mv(self.lm_head[best], last[0])
        return logits[None]

    def _forward(self, ids: torch.Tensor, cache: LeanCache) -> torch.Tensor:
        count, start = ids.shape[0], cache.length
        if start + count > self.context_length:
            raise ValueError(f"{start + count} positions exceed the model's context of {self.context_length}")
        cache.reserve(count)
        hidden = self.embedding[ids]  # [T, hidden], float32 (a copy: the residual stream is updated in place)
        rotation = self.rotation[start:start + count, None]  # [T, 1, d/2]
        mask = None
        if count > 1 and start:  # a chunk after cached positions: position i sees keys 0 .. start + i
            mask = torch.ones(count, start + count, dtype=torch.bool).tril(diagonal=start)
        for index, layer in enumerate(self.layers):
            hidden += self._attention(layer, index, hidden, cache, start, rotation, mask)
            hidden += layer.mlp(_rms_norm(hidden, layer.post_norm, self.eps, self.dtype))
        cache.length = start + count
        return hidden

    def _attention(self, layer: "_Layer", index: int, hidden: torch.Tensor, cache: LeanCache, start: int,
                   rotation: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        count, dim = hidden.shape[0], self.head_dim
        qkv = _project(_rms_norm(hidden, layer.input_norm, self.eps, self.dtype), layer.qkv)
        rotated_heads, q_size = self.heads + self.kv_heads, self.heads * dim
        pairs = torch.view_as_complex(qkv[:, :rotated_heads * dim].float().view(count, rotated_heads, dim // 2, 2))
        qk = torch.view_as_real(pairs * rotation).view(count, rotated_heads, dim)  # [T, heads + kv, d]
        end = start + count
        cache.keys[index, :, start:end] = qk[:, self.heads:].transpose(0, 1)
        cache.values[index, :, start:end] = qkv[:, q_size + self.kv_heads * dim:].view(
            count, self.kv_heads, dim).transpose(0, 1)
        keys, values = cache.keys[index, :, :end][None], cache.values[index, :, :end][None]  # [1, kv, L, d]
        query = qk[:, :self.heads].transpose(0, 1)[None].to(self.dtype)  # [1, heads, T, d]
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask,
                                             is_causal=count > 1 and mask is None, scale=self.scale,
                                             enable_gqa=True)
        return _project(out[0].transpose(0, 1).reshape(count, self.heads * dim), layer.o_proj)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """transformers' LlamaRMSNorm of the float32 rows `x`, written in `dtype`: (x * rsqrt(mean(x^2) + eps)) * w,
    the mean of squares from one norm pass and the last product written straight in `dtype` (two passes
    over the rows fewer than F.rms_norm and a cast)."""
    scale = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    return torch.mul(x * scale, weight, out=torch.empty(x.shape, dtype=dtype))


def _project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T. One row: torch.mv, whose bf16 kernel reads the weights ~1.4x faster than the matrix
    product's; more rows: the matrix product (AMX/AVX512-BF16 tiles for bf16)."""
    if x.shape[0] == 1:
        return torch.mv(weight, x[0])[None]
    return F.linear(x, weight)


def _interleaved(weight: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """A query or key projection's rows, per head, in the order 0, d/2, 1, d/2 + 1, ...: each rotated pair
    side by side, as the complex view of the rotary embedding reads them."""
    order = torch.arange(dim).view(2, dim // 2).t().reshape(dim)
    return weight.view(heads, dim, -1)[:, order].reshape(heads * dim, -1)


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def of(cls, layer: Any, dtype: torch.dtype, heads: int, kv_heads: int, dim: int) -> "_Layer":
        attention, mlp = layer.self_attn, layer.mlp
        weight = lambda module: module.weight.detach()  # noqa: E731
        return cls(input_norm=weight(layer.input_layernorm).float(),
                   qkv=torch.cat([_interleaved(weight(attention.q_proj), heads, dim),
                                  _interleaved(weight(attention.k_proj), kv_heads, dim),
                                  weight(attention.v_proj)]).to(dtype).contiguous(),
                   o_proj=weight(attention.o_proj).to(dtype).contiguous(),
                   post_norm=weight(layer.post_attention_layernorm).float(),
                   gate_up=torch.cat([weight(mlp.gate_proj), weight(mlp.up_proj)]).to(dtype).contiguous(),
                   down=weight(mlp.down_proj).to(dtype).contiguous())

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate(x)) * up(x)) of `x` in the weights' dtype, in its dtype."""
        gate, up = _project(x, self.gate_up).chunk(2, dim=-1)
        return _project(F.silu(gate, inplace=True).mul_(up), self.down)
