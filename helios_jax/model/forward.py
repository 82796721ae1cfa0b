"""Pure forwards of the Qwen3 target and its MTP draft head: functions of (params, inputs).

Every function here takes the frozen `ModelConfig` first (hashable: a static argument) and is
free of host round trips, so a program builder can write, for example,

    step = jax.jit(forward_packed, static_argnums=0, static_argnames="attention",
                   donate_argnums=2)
    compiled = step.lower(config, params, cache, batch).compile()
    hidden, cache = compiled(params, cache, batch)

and the donated cache is updated in place. Shapes:

    forward_full          tokens i32[T]                      -> hidden [T, H]
    forward_packed        cache, PackedBatch (T tokens)      -> (hidden [T, H], cache)
    compute_logits        hidden [..., H]                    -> f32[..., V]
    draft_forward_full    hidden [n, H], next_tokens i32[n]  -> draft hidden [n, H]
    draft_forward_packed  mtp cache, hidden [T, H], PackedBatch of next tokens
                                                             -> (draft hidden [T, H], mtp cache)

"hidden" is always the final-normed hidden state: the vector the output projection reads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from helios_jax.model.attention import (
    AttentionKernel,
    default_attention_kernel,
    full_sequence_attend,
    paged_attend,
)
from helios_jax.model.cache import PackedBatch, PagedKVCache, cache_write_locations
from helios_jax.model.config import ModelConfig
from helios_jax.model.qwen3 import Params, Qwen3


def softmax_scale(config: ModelConfig) -> float:
    return config.head_dim**-0.5


def init_params(config: ModelConfig, key: jax.Array) -> Params:
    """Random parameters (normal(0.02) matrices, unit norms), MTP head included when configured."""
    tokens = jnp.zeros((2,), jnp.int32)
    positions = jnp.arange(2, dtype=jnp.int32)
    variables = Qwen3(config).init(
        key,
        tokens,
        positions,
        full_sequence_attend(softmax_scale(config)),
        method=Qwen3.initialize_everything,
    )
    return variables["params"]


def param_shapes(config: ModelConfig) -> Params:
    """The parameter tree as `jax.ShapeDtypeStruct`s, computed without allocating."""
    return jax.eval_shape(lambda k: init_params(config, k), jax.random.key(0))


def forward_full(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    """Full-sequence forward without a cache; positions are 0..T-1.

    Args:
      tokens: i32[T].
    Returns:
      final-normed hidden states [T, H] in the model dtype.
    """
    positions = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    hidden, _ = Qwen3(config).apply(
        {"params": params}, tokens, positions, full_sequence_attend(softmax_scale(config)), None
    )
    return hidden


def compute_logits(config: ModelConfig, params: Params, hidden: jax.Array) -> jax.Array:
    """Output projection (tied or untied): hidden [..., H] -> f32[..., V]."""
    return Qwen3(config).apply({"params": params}, hidden, method=Qwen3.logits)


def forward_full_logits(config: ModelConfig, params: Params, tokens: jax.Array) -> jax.Array:
    """f32[T, V] logits of the full-sequence forward."""
    return compute_logits(config, params, forward_full(config, params, tokens))


def forward_packed(
    config: ModelConfig,
    params: Params,
    cache: PagedKVCache,
    batch: PackedBatch,
    *,
    attention: AttentionKernel | None = None,
) -> tuple[jax.Array, PagedKVCache]:
    """One packed step of the target: writes the new tokens' K/V, attends over the pages.

    Args:
      cache: the target's paged cache (donate it).
      batch: packed tokens and row metadata (`cache.py` documents the contract).
      attention: the ragged paged attention callable; defaults to
        `helios_jax.kernels.ragged_paged_attention.ragged_paged_attention`.
    Returns:
      (hidden [T, H], cache). Hidden states of padding tokens are meaningless but finite.
    """
    attend = _paged_attend(config, cache, batch, attention)
    return Qwen3(config).apply({"params": params}, batch.tokens, batch.positions, attend, cache)


def draft_forward_full(
    config: ModelConfig, params: Params, hidden: jax.Array, next_tokens: jax.Array
) -> jax.Array:
    """The MTP head over one whole sequence of pairs (h_i, x_{i+1}), i = 0..n-1, no cache.

    Args:
      hidden: [n, H] target hidden states at positions 0..n-1.
      next_tokens: i32[n], the token following each of them.
    Returns:
      draft hidden states [n, H]; logits of row i predict the token at i+2.
    """
    positions = jnp.arange(hidden.shape[0], dtype=jnp.int32)
    out, _ = Qwen3(config).apply(
        {"params": params},
        hidden,
        next_tokens,
        positions,
        full_sequence_attend(softmax_scale(config)),
        None,
        method=Qwen3.draft,
    )
    return out


def draft_forward_packed(
    config: ModelConfig,
    params: Params,
    cache: PagedKVCache,
    hidden: jax.Array,
    batch: PackedBatch,
    *,
    attention: AttentionKernel | None = None,
) -> tuple[jax.Array, PagedKVCache]:
    """One packed step of the MTP head over its own paged cache.

    Packed token t is the pair (hidden[t], batch.tokens[t]) = (h_i, x_{i+1}) at
    batch.positions[t] = i: the draft context keeps, at position i, the entry built from the
    target's hidden state at i and the token that followed it. Absorbing a prefill chunk,
    a decode step or an accepted verification prefix into the draft context is this call.

    Args:
      cache: the MTP head's paged cache (`init_paged_cache(..., num_layers=mtp_num_layers)`).
      hidden: [T, H] target (or previous draft) final-normed hidden states.
      batch: packed next tokens, their positions and row metadata.
    Returns:
      (draft hidden [T, H], cache).
    """
    attend = _paged_attend(config, cache, batch, attention)
    return Qwen3(config).apply(
        {"params": params},
        hidden,
        batch.tokens,
        batch.positions,
        attend,
        cache,
        method=Qwen3.draft,
    )


def _paged_attend(config, cache: PagedKVCache, batch: PackedBatch, attention):
    pages, slots = cache_write_locations(batch, cache.page_size, cache.total_pages)
    return paged_attend(
        pages=pages,
        slots=slots,
        page_tables=batch.page_tables,
        context_lens=batch.context_lens,
        query_starts=batch.query_starts,
        query_lens=batch.query_lens,
        sm_scale=softmax_scale(config),
        kernel=attention or default_attention_kernel(),
    )
