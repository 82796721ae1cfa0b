"""Qwen3 decoder and its multi-token-prediction (MTP) draft head as flax linen modules.

The modules hold parameters and the arithmetic of one token stream; they know nothing about
caches. Attention is delegated to an `attend` callable passed in at call time:

    attend(layer, q, k, v, kv_state) -> (out, kv_state)
      q:   [T, num_heads, head_dim]     rotary embeddings and q_norm already applied
      k,v: [T, num_kv_heads, head_dim]  rotary embeddings and k_norm already applied to k
      out: [T, num_heads, head_dim]

so the same parameters serve the full-sequence forward (`attention.causal_attend`, dense causal
attention, no state) and the packed paged forward (`forward.paged_attend`, which writes K/V
into the paged cache and calls the ragged paged attention kernel). `kv_state` is threaded
through the layers explicitly, which keeps every forward a pure function of (params, inputs).

Parameter tree (flax names; Hugging Face names in `weights.py`):

    embed_tokens/embedding                      [V, H]
    layers_{i}/input_layernorm/weight           [H]
    layers_{i}/self_attn/{q,k,v,o}_proj/kernel  [in, out]   (the transpose of torch's Linear)
    layers_{i}/self_attn/{q,k}_norm/weight      [head_dim]
    layers_{i}/post_attention_layernorm/weight  [H]
    layers_{i}/mlp/{gate,up,down}_proj/kernel   [in, out]
    (with `fused_projections`, the prepared programs' layout, `model/fused.py`:
    layers_{i}/self_attn/qkv_proj/kernel        [H, kv_heads, queries_per_kv + 2, head_dim]
    layers_{i}/mlp/gate_up_proj/kernel          [H, 2, I]   in place of q, k, v and gate, up)
    norm/weight                                 [H]
    lm_head/kernel                              [H, V]      (absent when embeddings are tied)
    mtp/pre_fc_norm_embedding/weight            [H]         (mtp/* only when mtp_num_layers > 0)
    mtp/pre_fc_norm_hidden/weight               [H]
    mtp/fc/kernel                               [2H, H]     input is concat(embedding, hidden)
    mtp/layers_{j}/...                          as layers_{i}
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Union

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.typing import DTypeLike

from helios_jax.model.cache import PagedKVCache
from helios_jax.model.config import ModelConfig

# The `params` collection of `Qwen3`: nested dicts whose leaves are arrays.
Params = dict[str, Union["Params", jax.Array]]
KVState = PagedKVCache | None  # None for the full-sequence forward
# attend(layer, q, k, v, kv_state) -> (out, kv_state); the decoder binds `layer` itself, so
# modules below the top level see attend(q, k, v, kv_state).
AttendFn = Callable[..., tuple[jax.Array, KVState]]

_INIT_STD = 0.02  # transformers' initializer_range default


def matmul_precision(dtype: DTypeLike) -> jax.lax.Precision:
    """float32 models compute in true float32 (no TF32 on GPUs); narrower dtypes use the default."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in float32, cast back, then scale (transformers' order)."""

    eps: float
    dtype: DTypeLike

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.dtype)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return weight * x32.astype(x.dtype)


def _dense(features: int, dtype: DTypeLike, name: str | None = None) -> nn.Dense:
    return nn.Dense(
        features,
        use_bias=False,
        dtype=dtype,
        param_dtype=dtype,
        precision=matmul_precision(dtype),
        kernel_init=nn.initializers.normal(_INIT_STD),
        name=name,
    )


class FusedProjection(nn.Module):
    """Sibling projections as one product (``model/fused.py``): x `[T, H]` times `kernel`
    `[H, *out_shape]` gives `[T, *out_shape]`; a Dense's parameter name, initializer and
    precision."""

    out_shape: tuple[int, ...]
    dtype: DTypeLike

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        shape = (x.shape[-1], *self.out_shape)
        kernel = self.param("kernel", nn.initializers.normal(_INIT_STD), shape, self.dtype)
        return jnp.tensordot(x.astype(self.dtype), kernel, axes=1, precision=matmul_precision(self.dtype))


def rotary_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables `f32[T, head_dim]` of transformers' default rope.

    Frequencies are laid out as concat(freqs, freqs), matching `rotate_half`.
    """
    exponent = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)  # f32[head_dim // 2]
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x `[T, heads, head_dim]`; rotate_half convention: (x1, x2) -> (-x2, x1)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, None, :].astype(x.dtype)
    sin = sin[:, None, :].astype(x.dtype)
    return x * cos + rotated * sin


class OutputProjection(nn.Module):
    """The untied output projection, kernel [H, V]; logits accumulate in float32."""

    config: ModelConfig

    @nn.compact
    def __call__(self, hidden):
        c = self.config
        kernel = self.param(
            "kernel", nn.initializers.normal(_INIT_STD), (c.hidden_size, c.vocab_size), c.jnp_dtype
        )
        return jnp.einsum(
            "...h,hv->...v",
            hidden,
            kernel,
            precision=matmul_precision(c.jnp_dtype),
            preferred_element_type=jnp.float32,
        )


class Attention(nn.Module):
    """Grouped-query attention projections with per-head q/k RMSNorm; `attend` does the rest."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, cos, sin, attend: AttendFn, kv_state: KVState):
        c = self.config
        dt = c.jnp_dtype
        t = x.shape[0]
        if c.fused_projections:  # one product: per KV head, its query heads, then k, then v
            g = c.queries_per_kv
            qkv = FusedProjection((c.num_kv_heads, g + 2, c.head_dim), dt, name="qkv_proj")(x)
            q = qkv[:, :, :g].reshape(t, c.num_heads, c.head_dim)
            k, v = qkv[:, :, g], qkv[:, :, g + 1]
        else:
            q = _dense(c.num_heads * c.head_dim, dt, "q_proj")(x).reshape(t, c.num_heads, c.head_dim)
            k = _dense(c.num_kv_heads * c.head_dim, dt, "k_proj")(x).reshape(t, c.num_kv_heads, c.head_dim)
            v = _dense(c.num_kv_heads * c.head_dim, dt, "v_proj")(x).reshape(t, c.num_kv_heads, c.head_dim)
        # Qwen3 normalises each head before the rotation.
        q = RMSNorm(c.rms_norm_eps, dt, name="q_norm")(q)
        k = RMSNorm(c.rms_norm_eps, dt, name="k_norm")(k)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out, kv_state = attend(q, k, v, kv_state)
        out = out.astype(dt).reshape(t, c.num_heads * c.head_dim)
        return _dense(c.hidden_size, dt, "o_proj")(out), kv_state


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        c = self.config
        dt = c.jnp_dtype
        if c.fused_projections:  # one product: [gate | up] stacked on the kernel's middle axis
            gate_up = FusedProjection((2, c.intermediate_size), dt, name="gate_up_proj")(x)
            gate, up = gate_up[:, 0], gate_up[:, 1]
        else:
            gate = _dense(c.intermediate_size, dt, "gate_proj")(x)
            up = _dense(c.intermediate_size, dt, "up_proj")(x)
        return _dense(c.hidden_size, dt, "down_proj")(jax.nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x, cos, sin, attend: AttendFn, kv_state: KVState):
        c = self.config
        dt = c.jnp_dtype
        h = RMSNorm(c.rms_norm_eps, dt, name="input_layernorm")(x)
        h, kv_state = Attention(c, name="self_attn")(h, cos, sin, attend, kv_state)
        x = x + h
        h = RMSNorm(c.rms_norm_eps, dt, name="post_attention_layernorm")(x)
        return x + MLP(c, name="mlp")(h), kv_state


class MtpHead(nn.Module):
    """The draft head's own parameters: input norms, the fusing projection and its blocks.

    It fuses the next token's embedding with the target hidden state that predicted it:
        u = fc(concat(rms(embedding(x_{i+1})), rms(h_i)))
    and runs its own decoder blocks on u (with their own KV cache). The shared final norm and
    output projection are applied by `Qwen3.draft`.
    """

    config: ModelConfig

    def setup(self):
        c = self.config
        dt = c.jnp_dtype
        self.pre_fc_norm_embedding = RMSNorm(c.rms_norm_eps, dt)
        self.pre_fc_norm_hidden = RMSNorm(c.rms_norm_eps, dt)
        self.fc = _dense(c.hidden_size, dt)
        self.layers = [DecoderLayer(c) for _ in range(c.mtp_num_layers)]

    def __call__(self, embedded, hidden, cos, sin, attend: AttendFn, kv_state: KVState):
        fused = jnp.concatenate(
            [self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden.astype(embedded.dtype))],
            axis=-1,
        )
        x = self.fc(fused)
        for i, layer in enumerate(self.layers):
            x, kv_state = layer(x, cos, sin, functools.partial(attend, i), kv_state)
        return x, kv_state


class Qwen3(nn.Module):
    """Qwen3 causal LM over one packed token stream, plus the optional MTP draft head.

    Methods (all through `Qwen3(config).apply({"params": params}, ..., method=...)`):
      __call__(tokens, positions, attend, kv_state) -> (hidden, kv_state): final-normed
        hidden states `[T, H]` (the vector the output projection reads).
      logits(hidden) -> f32[..., V].
      draft(hidden, next_tokens, positions, attend, kv_state) -> (draft_hidden, kv_state):
        one MTP step; `hidden` is the target's final-normed hidden state at position i,
        `next_tokens` the token at i+1, `positions` is i. Returns final-normed draft hidden
        states whose logits predict the token at i+2.
    """

    config: ModelConfig

    def setup(self):
        c = self.config
        dt = c.jnp_dtype
        self.embed_tokens = nn.Embed(
            c.vocab_size,
            c.hidden_size,
            dtype=dt,
            param_dtype=dt,
            embedding_init=nn.initializers.normal(_INIT_STD),
        )
        self.layers = [DecoderLayer(c) for _ in range(c.num_layers)]
        self.norm = RMSNorm(c.rms_norm_eps, dt)
        if not c.tie_word_embeddings:
            self.lm_head = OutputProjection(c)
        if c.has_mtp:
            self.mtp = MtpHead(c)

    def __call__(self, tokens, positions, attend: AttendFn, kv_state: KVState):
        c = self.config
        cos, sin = rotary_cos_sin(positions, c.head_dim, c.rope_theta)
        x = self.embed_tokens(tokens)
        for i, layer in enumerate(self.layers):
            x, kv_state = layer(x, cos, sin, functools.partial(attend, i), kv_state)
        return self.norm(x), kv_state

    def logits(self, hidden):
        c = self.config
        hidden = hidden.astype(c.jnp_dtype)
        if c.tie_word_embeddings:
            weight = self.embed_tokens.embedding  # [V, H]
            return jnp.einsum(
                "...h,vh->...v",
                hidden,
                weight,
                precision=matmul_precision(c.jnp_dtype),
                preferred_element_type=jnp.float32,
            )
        return self.lm_head(hidden)

    def draft(self, hidden, next_tokens, positions, attend: AttendFn, kv_state: KVState):
        c = self.config
        if not c.has_mtp:
            raise ValueError("this config has no MTP draft head (mtp_num_layers == 0)")
        cos, sin = rotary_cos_sin(positions, c.head_dim, c.rope_theta)
        x, kv_state = self.mtp(self.embed_tokens(next_tokens), hidden, cos, sin, attend, kv_state)
        return self.norm(x), kv_state

    def initialize_everything(self, tokens, positions, attend: AttendFn):
        """Touches every submodule so that `init` creates the whole parameter tree."""
        hidden, _ = self(tokens, positions, attend, None)
        out = self.logits(hidden)
        if self.config.has_mtp:
            draft_hidden, _ = self.draft(hidden, tokens, positions, attend, None)
            out = out + self.logits(draft_hidden)
        return out
