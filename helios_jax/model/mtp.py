"""Sequential draft proposals from the MTP head: D steps, greedy or sampled, one jittable call.

Each active row r arrives with the target's final-normed hidden state h at its last verified
position p = positions[r] and the pending token x_{p+1} = next_tokens[r] (already chosen by the
target). Step k = 0..D-1 runs the draft head on the pair (h, x) at position p + k, writing that
entry into the MTP cache, and turns the draft logits into proposal k, a draft of the token at
position p + k + 2; the draft hidden state and the proposal become the next step's pair:

    step 0: (h_p,      x_{p+1})  at p     -> proposal d_{p+2}
    step 1: (g_0,      d_{p+2})  at p + 1 -> proposal d_{p+3}
    ...
    step k: (g_{k-1},  d_{p+k+1}) at p + k -> proposal d_{p+k+2}

so the MTP cache must already hold the draft context of positions 0..p-1 (absorbed by
`forward.draft_forward_packed` during prefill, decode and verification commits). Entries the
steps write past the verified context are provisional: a later commit overwrites them, and no
rollback is needed because validity is only ever the row's context length.

Each step is one packed call with one token per active row. The kernel contract asks for
query_starts as exclusive prefix sums of query_lens, so active rows are packed densely:
row r sits at packed index query_starts[r]. Inactive rows write nothing and get token 0 with
probability 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.model.attention import AttentionKernel
from helios_jax.model.cache import PackedBatch, PagedKVCache
from helios_jax.model.config import ModelConfig
from helios_jax.model.forward import compute_logits, draft_forward_packed
from helios_jax.model.qwen3 import Params


@struct.dataclass
class Proposals:
    """What `propose` returns."""

    tokens: jax.Array  # i32[R, D] proposal k of row r drafts the token at positions[r] + k + 2
    token_probs: jax.Array  # f32[R, D] draft probability q of each proposed token
    probs: jax.Array | None  # f32[R, D, V] full draft distributions (return_probs=True only)
    cache: PagedKVCache  # the MTP cache with the D provisional entries written


def propose(
    config: ModelConfig,
    params: Params,
    cache: PagedKVCache,
    hidden: jax.Array,
    next_tokens: jax.Array,
    positions: jax.Array,
    page_tables: jax.Array,
    active: jax.Array,
    *,
    depth: int,
    key: jax.Array | None = None,
    temperature: jax.Array | float = 1.0,
    return_probs: bool = False,
    attention: AttentionKernel | None = None,
) -> Proposals:
    """Runs `depth` sequential MTP proposals for every active row.

    Args:
      cache: the MTP head's paged cache holding each row's draft context (donate it).
      hidden: [R, H] target final-normed hidden state at positions[r].
      next_tokens: i32[R] the pending token, at positions[r] + 1.
      positions: i32[R] the position of `hidden`.
      page_tables: i32[R, pages_per_row] of the MTP cache; must cover positions[r] + depth - 1.
      active: bool[R]; inactive rows write nothing.
      depth: D, number of proposals (static).
      key: None for greedy proposals (argmax), else a PRNG key; step k samples with
        `jax.random.fold_in(key, k)`.
      temperature: scalar or f32[R]; draft distributions are softmax(logits / temperature).
        Greedy proposals take the argmax and report its probability under that distribution.
      return_probs: also return the full draft distributions (for residual resampling).
      attention: ragged paged attention callable (defaults to the kernel module).
    Returns:
      `Proposals`.
    """
    rows = hidden.shape[0]
    active = active.astype(bool)
    query_lens = active.astype(jnp.int32)
    query_starts = (jnp.cumsum(query_lens) - query_lens).astype(jnp.int32)
    # Active row r -> packed index query_starts[r]; inactive rows aim past the end (dropped).
    packed_index = jnp.where(active, query_starts, rows)
    temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (rows,))

    def pack(values, fill):
        base = jnp.full((rows,) + values.shape[1:], fill, values.dtype)
        return base.at[packed_index].set(values, mode="drop")

    def step(carry, k):
        cache, h, x, pos = carry
        batch = PackedBatch(
            tokens=pack(x, 0),
            positions=pack(pos, 0),
            page_tables=page_tables,
            context_lens=jnp.where(active, pos + 1, 0).astype(jnp.int32),
            query_starts=query_starts,
            query_lens=query_lens,
        )
        packed_hidden, cache = draft_forward_packed(
            config, params, cache, pack(h, 0), batch, attention=attention
        )
        g = packed_hidden[jnp.clip(query_starts, 0, rows - 1)]  # back to row order
        logits = compute_logits(config, params, g) / temperature[:, None]
        probs = jax.nn.softmax(logits, axis=-1)
        if key is None:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        else:
            token = jax.random.categorical(jax.random.fold_in(key, k), logits).astype(jnp.int32)
        token = jnp.where(active, token, 0)
        q = jnp.where(active, jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0], 0.0)
        out = (token, q, probs if return_probs else None)
        return (cache, g.astype(hidden.dtype), token, pos + 1), out

    carry = (cache, hidden, next_tokens.astype(jnp.int32), positions.astype(jnp.int32))
    (cache, _, _, _), (tokens, token_probs, probs) = jax.lax.scan(
        step, carry, jnp.arange(depth, dtype=jnp.int32)
    )
    return Proposals(
        tokens=tokens.T,
        token_probs=token_probs.T,
        probs=None if probs is None else jnp.swapaxes(probs, 0, 1),
        cache=cache,
    )
