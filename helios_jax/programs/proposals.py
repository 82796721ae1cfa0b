"""D sequential proposals per lane from the MTP head: learned draws or supplied copy prefixes
(a model without an MTP head proposes its copy prefixes alone: `copy_only_proposals`).

This is the one production draft loop. It is the plain paged MTP proposal loop (whose
independent copy, the oracle `helios_jax.reference.mtp.paged_proposals`, the tests hold it to:
greedy learned proposals equal it token for token) generalised in three ways that complete
speculative generation needs:
  - per-lane sampling settings: greedy lanes take the argmax, sampled lanes draw from their own
    tempered, top-k/top-p filtered draft distribution q (`sampling.sampling_probs`), so rejection
    sampling can compare against the distribution each proposal was really drawn from;
  - copy lanes (copy_lengths[b] >= 0): proposal k is the supplied copy_tokens[b, k] for
    k < copy_lengths[b] (q is the point mass; the draft head is teacher-forced along the copied
    path so that its confidence and provisional entries follow it); a copy lane draws nothing;
  - the draft confidence of every produced proposal (`sampling.confidence_probs`);
  - coupled lanes (seeded requests, RESOLUTIONS.md 30) draw proposal k from q with the Gumbel
    noise keyed by (seed, c + k + 1), the noise the target uses for that position
    (`sampling.position_noise`), so the proposal is accepted exactly when it is the target's
    token there.

Step k of lane b runs the pair (g_{k-1}, d_{k-1}) at position c - 1 + k (step 0: the carried pair
(h_{c-1}, x_c) from the state) and drafts the token at c + k + 1. Entry c - 1 is final (x_c is
committed); the entries the later steps write are provisional and are overwritten when accepted
tokens are absorbed with the target's hidden states.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.model import ModelConfig, PackedBatch, PagedKVCache, compute_logits, draft_forward_packed
from helios_jax.programs.sampling import confidence_probs, draw, position_noise


@struct.dataclass
class DraftProposals:
    tokens: jax.Array  # i32[B, D] proposal k drafts the token at cursor + k + 1; 0 when absent
    probs: jax.Array  # f32[B, D, V] q_k, the distribution proposal k was drawn from
    confidence: jax.Array  # f32[B, D] draft confidence of each produced proposal; 0 when absent
    available: jax.Array  # i32[B] proposals produced: D for learned lanes, copy length for copy
    cache: PagedKVCache | None  # the MTP cache with the carried and provisional entries (None: no head)


def draft_proposals(
    config: ModelConfig,
    params,
    cache: PagedKVCache,
    *,
    hidden: jax.Array,  # [B, H] h_{c-1} per lane
    pending: jax.Array,  # i32[B] x_c
    cursor: jax.Array,  # i32[B] c (>= 1 for an active lane)
    page_tables: jax.Array,  # i32[B, pages_per_row]
    active: jax.Array,  # bool[B] lanes that propose
    temperature: jax.Array,  # f32[B]
    top_k: jax.Array,  # i32[B]
    top_p: jax.Array,  # f32[B]
    key: jax.Array,  # typed keys [B]; step k draws with fold_in(key[b], k)
    copy_tokens: jax.Array,  # i32[B, D]
    copy_lengths: jax.Array,  # i32[B]; -1 for a learned lane
    depth: int,
    attention=None,
    coupled: jax.Array | None = None,  # bool[B] lanes drawing with keyed noise (None: none)
    noise_key: jax.Array | None = None,  # typed keys [B]: the seed's key of a coupled lane
) -> DraftProposals:
    """Runs the D sequential proposal steps of every active lane (module docstring), one scan."""
    lanes = hidden.shape[0]
    vocab = config.vocab_size
    packing = _lane_packing(active, page_tables)
    is_copy = active & (copy_lengths >= 0)
    available = jnp.where(active, jnp.where(is_copy, jnp.minimum(copy_lengths, depth), depth), 0)

    def step(carry, k):
        cache, h, x = carry
        g, cache = _draft_step(config, params, cache, h, x, cursor - 1 + k, packing, attention)
        logits = compute_logits(config, params, g)
        token, q, conf = _proposal(
            logits,
            k,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            key=key,
            is_copy=is_copy,
            copy_tokens=copy_tokens,
            available=available,
            coupled=coupled,
            noise=None if coupled is None else lambda: position_noise(noise_key, cursor + k + 1, vocab),
        )
        return (cache, g.astype(hidden.dtype), token), (token, q, conf)

    carry = (cache, hidden, pending.astype(jnp.int32))
    (cache, _, _), (tokens, probs, conf) = jax.lax.scan(step, carry, jnp.arange(depth, dtype=jnp.int32))
    return DraftProposals(
        tokens=tokens.T.reshape(lanes, depth),
        probs=jnp.swapaxes(probs, 0, 1).reshape(lanes, depth, vocab),
        confidence=conf.T.reshape(lanes, depth),
        available=available.astype(jnp.int32),
        cache=cache,
    )


def copy_only_proposals(
    *,
    active: jax.Array,  # bool[B] lanes that propose
    copy_tokens: jax.Array,  # i32[B, D]
    copy_lengths: jax.Array,  # i32[B]; -1: a learned lane, which proposes nothing here
    depth: int,
    vocab: int,
) -> DraftProposals:
    """The proposals of a model without a draft head: each copy lane's supplied prefix (q its point
    mass), nothing for the others. With no draft model, a copy's draft confidence is q's own
    probability of it, 1 (docs/spec/RESOLUTIONS.md, 33): the device allocation then ranks copy
    lanes by their prefix lengths within their ceilings, ties to lower slots."""
    available = jnp.where(active & (copy_lengths >= 0), jnp.minimum(copy_lengths, depth), 0)
    present = jnp.arange(depth, dtype=jnp.int32)[None, :] < available[:, None]  # bool[B, D]
    tokens = jnp.where(present, copy_tokens[:, :depth], 0).astype(jnp.int32)
    return DraftProposals(
        tokens=tokens,
        probs=jax.nn.one_hot(tokens, vocab, dtype=jnp.float32),
        confidence=present.astype(jnp.float32),
        available=available.astype(jnp.int32),
        cache=None,
    )


@struct.dataclass
class _LanePacking:
    """The proposing lanes packed densely, one token each: lane b at packed index query_starts[b]
    (the kernel contract wants query_starts to be the exclusive prefix sums of query_lens)."""

    active: jax.Array  # bool[B] lanes that propose
    query_lens: jax.Array  # i32[B] 1 for an active lane, 0 otherwise
    query_starts: jax.Array  # i32[B] exclusive prefix sums of query_lens
    packed_index: jax.Array  # i32[B] query_starts for an active lane, B (dropped) otherwise
    page_tables: jax.Array  # i32[B, pages_per_row]


def _lane_packing(active: jax.Array, page_tables: jax.Array) -> _LanePacking:
    lanes = active.shape[0]
    query_lens = active.astype(jnp.int32)
    query_starts = (jnp.cumsum(query_lens) - query_lens).astype(jnp.int32)
    packed_index = jnp.where(active, query_starts, lanes)  # dense packing, inactive dropped
    return _LanePacking(active, query_lens, query_starts, packed_index, page_tables)


def _draft_step(config, params, cache, h, x, pos, packing: _LanePacking, attention):
    """One packed draft-head call over the pairs (h [B, H], x i32[B]) at positions pos i32[B].

    Returns:
      (g [B, H] the draft hidden states back in lane order, the MTP cache with entry pos written).
    """
    lanes = h.shape[0]
    batch = PackedBatch(
        tokens=_pack(x, packing.packed_index),
        positions=_pack(pos, packing.packed_index),
        page_tables=packing.page_tables,
        context_lens=jnp.where(packing.active, pos + 1, 0).astype(jnp.int32),
        query_starts=packing.query_starts,
        query_lens=packing.query_lens,
    )
    packed_hidden, cache = draft_forward_packed(
        config, params, cache, _pack(h, packing.packed_index), batch, attention=attention
    )
    return packed_hidden[jnp.clip(packing.query_starts, 0, lanes - 1)], cache  # back to lane order


def _pack(values: jax.Array, packed_index: jax.Array) -> jax.Array:
    """Lane-order rows -> dense packed order (lane b at packed_index[b]; indices past the end,
    the inactive lanes, are dropped); unfilled packed rows are 0."""
    lanes = packed_index.shape[0]
    base = jnp.full((lanes,) + values.shape[1:], 0, values.dtype)
    return base.at[packed_index].set(values, mode="drop")


def _proposal(logits, k, *, temperature, top_k, top_p, key, is_copy, copy_tokens, available, coupled, noise):
    """Step k's proposal per lane from its draft logits f32[B, V]: a draw from the lane's filtered
    draft distribution q, or the supplied copy token with q its point mass; 0 past `available`.

    Returns:
      (token i32[B], q f32[B, V], draft confidence of the token f32[B], 0 where absent).
    """
    # Copy lanes and absent proposals discard the draw and q: only the others decide whether the
    # all-greedy fast path (argmax, no softmax or cumulative sums) applies.
    drawn, q = draw(
        logits,
        temperature,
        top_k,
        top_p,
        lambda: jax.vmap(lambda kk: jax.random.uniform(jax.random.fold_in(kk, k)))(key),
        live=(k < available) & ~is_copy,
        coupled=coupled,
        noise=noise,
    )
    present = k < available  # lane b produces available[b] proposals
    token = jnp.where(present, jnp.where(is_copy, copy_tokens[:, k], drawn), 0).astype(jnp.int32)
    q = jnp.where(is_copy[:, None], jax.nn.one_hot(token, logits.shape[-1], dtype=jnp.float32), q)
    conf = jnp.take_along_axis(confidence_probs(logits, temperature), token[:, None], axis=-1)[:, 0]
    return token, q, jnp.where(present, conf, 0.0)
