"""Oracles of the MTP draft head: a deliberately naive numpy forward and proposal loop, and an
independent paged, scanned proposal loop in JAX.

The head (DeepSeek-V3 / Qwen3-Next style), by transformers-style tensor names:

    u_i  = mtp.fc( concat( rms(embed(x_{i+1}); mtp.pre_fc_norm_embedding),
                           rms(h_i;            mtp.pre_fc_norm_hidden) ) )
    u    = mtp.layers.0 .. mtp.layers.{L-1}   (Qwen3 blocks, causal over i = 0..n-1, rope at i)
    g_i  = rms(u_i; model.norm)               the shared final norm
    logits_i = output projection(g_i)         the shared lm_head (or tied embeddings)

h_i is the target's final-normed hidden state at position i, x_{i+1} the token after it, and
logits_i draft the token at i + 2. Nothing is cached in the numpy oracle: `naive_proposals`
recomputes the whole draft sequence for every proposal.

`paged_proposals` is the same proposal loop over the paged MTP cache, one packed call per step
(the model's `draft_forward_packed`), greedy or sampled with `jax.random.categorical`. It shares
no code with the production draft loop, `helios_jax.programs.proposals.draft_proposals` (per-lane
sampling settings, copy lanes, draft confidence), so the chain of checks is: tests/model/test_mtp.py
holds `paged_proposals` to `naive_proposals`, and tests/programs/test_speculative.py holds greedy
learned `draft_proposals` to `paged_proposals` on the programs' own device state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from helios_jax.model.attention import AttentionKernel
from helios_jax.model.cache import PackedBatch, PagedKVCache
from helios_jax.model.config import ModelConfig
from helios_jax.model.forward import compute_logits, draft_forward_packed
from helios_jax.model.qwen3 import Params
from helios_jax.reference.qwen3 import (
    Weights,
    decoder_block,
    linear,
    output_logits,
    rms_norm,
)


def mtp_forward(weights: Weights, config, hidden, next_tokens) -> tuple[np.ndarray, np.ndarray]:
    """The draft head over pairs (hidden[i], next_tokens[i]) at positions i = 0..n-1.

    Args:
      weights: {name: ndarray} including `mtp.*`, `model.embed_tokens.weight`,
        `model.norm.weight` and the output projection.
      config: a ModelConfig (sizes and constants only).
      hidden: [n, H] target final-normed hidden states.
      next_tokens: [n] the token following each position.
    Returns:
      (draft hidden [n, H], logits [n, V]), float64.
    """
    eps = config.rms_norm_eps
    hidden = np.asarray(hidden, np.float64)
    rows = []
    for i, token in enumerate(next_tokens):
        e = rms_norm(
            weights["model.embed_tokens.weight"][int(token)], weights["mtp.pre_fc_norm_embedding.weight"], eps
        )
        h = rms_norm(hidden[i], weights["mtp.pre_fc_norm_hidden.weight"], eps)
        rows.append(linear(np.concatenate([e, h])[None, :], weights["mtp.fc.weight"])[0])
    x = np.stack(rows)
    positions = list(range(len(rows)))
    for layer in range(config.mtp_num_layers):
        x = decoder_block(weights, f"mtp.layers.{layer}.", x, positions, config)
    draft = rms_norm(x, weights["model.norm.weight"], eps)
    return draft, output_logits(weights, config, draft)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def naive_proposals(
    weights: Weights, config, hidden, next_tokens, depth: int, choose=None, temperature: float = 1.0
):
    """`depth` sequential proposals after the draft context (hidden[i], next_tokens[i]), i <= p.

    Step k appends the previous step's (draft hidden, proposal) pair at position p + k + 1 and
    recomputes the whole draft sequence from scratch.

    Args:
      hidden, next_tokens: the whole context, [p + 1, H] and [p + 1].
      depth: number of proposals D.
      choose: (step, probabilities) -> token; greedy argmax when None.
      temperature: draft distributions are softmax(logits / temperature).
    Returns:
      (tokens [D], probability of each token under its draft distribution [D]).
    """
    hidden = list(np.asarray(hidden, np.float64))
    tokens = [int(t) for t in next_tokens]
    proposals, probs = [], []
    for k in range(depth):
        draft, logits = mtp_forward(weights, config, np.stack(hidden), tokens)
        p = softmax(logits[-1] / temperature)
        token = int(np.argmax(p)) if choose is None else int(choose(k, p))
        proposals.append(token)
        probs.append(float(p[token]))
        hidden.append(draft[-1])
        tokens.append(token)
    return np.array(proposals), np.array(probs)


# ---------------------------------------------------------------------------------------------
# The paged proposal loop.
#
# Each active row r arrives with the target's final-normed hidden state h at its last verified
# position p = positions[r] and the pending token x_{p+1} = next_tokens[r] (already chosen by the
# target). Step k = 0..D-1 runs the draft head on the pair (h, x) at position p + k, writing that
# entry into the MTP cache, and turns the draft logits into proposal k, a draft of the token at
# position p + k + 2; the draft hidden state and the proposal become the next step's pair:
#
#     step 0: (h_p,      x_{p+1})  at p     -> proposal d_{p+2}
#     step 1: (g_0,      d_{p+2})  at p + 1 -> proposal d_{p+3}
#     ...
#     step k: (g_{k-1},  d_{p+k+1}) at p + k -> proposal d_{p+k+2}
#
# so the MTP cache must already hold the draft context of positions 0..p-1 (absorbed by
# `forward.draft_forward_packed` during prefill, decode and verification commits). Entries the
# steps write past the verified context are provisional: a later commit overwrites them, and no
# rollback is needed because validity is only ever the row's context length.
#
# Each step is one packed call with one token per active row. The kernel contract asks for
# query_starts as exclusive prefix sums of query_lens, so active rows are packed densely:
# row r sits at packed index query_starts[r]. Inactive rows write nothing and get token 0 with
# probability 0.


@struct.dataclass
class Proposals:
    """What `paged_proposals` returns."""

    tokens: jax.Array  # i32[R, D] proposal k of row r drafts the token at positions[r] + k + 2
    token_probs: jax.Array  # f32[R, D] draft probability q of each proposed token
    probs: jax.Array | None  # f32[R, D, V] full draft distributions (return_probs=True only)
    cache: PagedKVCache  # the MTP cache with the D provisional entries written


def paged_proposals(
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
    packing = _dense_packing(active)
    temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (rows,))

    def step(carry, k):
        cache, h, x, pos = carry
        g, cache = _draft_step(config, params, cache, h, x, pos, page_tables, active, packing, attention)
        logits = compute_logits(config, params, g) / temperature[:, None]
        token, q, probs = _choose(logits, key, k, active)
        out = (token, q, probs if return_probs else None)
        return (cache, g.astype(hidden.dtype), token, pos + 1), out

    carry = (cache, hidden, next_tokens.astype(jnp.int32), positions.astype(jnp.int32))
    steps = jnp.arange(depth, dtype=jnp.int32)
    (cache, _, _, _), (tokens, token_probs, probs) = jax.lax.scan(step, carry, steps)
    return Proposals(
        tokens=tokens.T,
        token_probs=token_probs.T,
        probs=None if probs is None else jnp.swapaxes(probs, 0, 1),
        cache=cache,
    )


class _Packing(NamedTuple):
    """One token per active row, packed densely (module comment above `Proposals`)."""

    query_lens: jax.Array  # i32[R] 1 for an active row, 0 otherwise
    query_starts: jax.Array  # i32[R] exclusive prefix sums of query_lens
    packed_index: jax.Array  # i32[R] query_starts[r] for an active row, R (dropped) otherwise


def _dense_packing(active: jax.Array) -> _Packing:
    rows = active.shape[0]
    query_lens = active.astype(jnp.int32)
    query_starts = (jnp.cumsum(query_lens) - query_lens).astype(jnp.int32)
    # Active row r -> packed index query_starts[r]; inactive rows aim past the end (dropped).
    packed_index = jnp.where(active, query_starts, rows)
    return _Packing(query_lens, query_starts, packed_index)


def _draft_step(config, params, cache, h, x, pos, page_tables, active, packing: _Packing, attention):
    """One packed call of the draft head on the rows' pairs (h [R, H], x i32[R]) at positions
    pos i32[R]. Returns (draft hidden states [R, H] in row order, the cache with entry pos written)."""
    rows = h.shape[0]
    batch = PackedBatch(
        tokens=_pack_rows(x, packing.packed_index),
        positions=_pack_rows(pos, packing.packed_index),
        page_tables=page_tables,
        context_lens=jnp.where(active, pos + 1, 0).astype(jnp.int32),
        query_starts=packing.query_starts,
        query_lens=packing.query_lens,
    )
    packed_hidden, cache = draft_forward_packed(
        config, params, cache, _pack_rows(h, packing.packed_index), batch, attention=attention
    )
    return packed_hidden[jnp.clip(packing.query_starts, 0, rows - 1)], cache  # back to row order


def _pack_rows(values: jax.Array, packed_index: jax.Array) -> jax.Array:
    """Row order -> dense packed order; rows aimed past the end are dropped, unfilled rows are 0."""
    rows = packed_index.shape[0]
    base = jnp.full((rows,) + values.shape[1:], 0, values.dtype)
    return base.at[packed_index].set(values, mode="drop")


def _choose(logits: jax.Array, key: jax.Array | None, k: jax.Array, active: jax.Array):
    """Proposal k of each row from its tempered draft logits f32[R, V]: the argmax (key None) or a
    draw under fold_in(key, k). Returns (token i32[R], its probability f32[R], softmax f32[R, V]);
    inactive rows get token 0 with probability 0."""
    probs = jax.nn.softmax(logits, axis=-1)
    if key is None:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    else:
        token = jax.random.categorical(jax.random.fold_in(key, k), logits).astype(jnp.int32)
    token = jnp.where(active, token, 0)
    q = jnp.where(active, jnp.take_along_axis(probs, token[:, None], axis=-1)[:, 0], 0.0)
    return token, q, probs
