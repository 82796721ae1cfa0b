"""One packed round: the shared body of prefill, decode, speculative and mixed programs.

Every generation program is the same sequence of stages over B lanes; the program kinds differ
only in static extents and in which lanes carry a prompt:

  1. gather     each lane's row: cursor c, pending x_c, h_{c-1}, sampling settings, PRNG key
  2. propose    D > 0: D sequential MTP proposals for decode lanes (`proposals.py`), with
                their draft confidence -> the sidecar rows (confidence, joint prefix prob.)
  3. allocate   target rows L_b: host query lengths, or the device prefix allocation from the
                joint prefix probabilities within the lane ceilings and P (`impls.Impl.allocate`)
  4. verify     one packed target forward over all lanes; offsets are the exclusive prefix sums
                of L. A decode lane feeds [x_c, d_0, .., d_{L-2}] at positions c..c+L-1; the prompt
                lane feeds its chunk (uploaded by the host at its packed offset)
  5. accept     target distributions at each decode lane's rows and at the prompt's last token;
                greedy/rejection acceptance (`acceptance.py`); the prompt lane just samples
  6. commit     m committed tokens per lane (a + 1 for a decode lane, the chunk for the prompt):
                cursor += m, pending = last emitted token, h = target hidden at c + m - 1,
                emitted tokens added to the row's output counts (processors.py).
                Rejected rows' KV stays past the cursor and never becomes visible context
  7. absorb     (draft maintenance) one packed MTP forward over the committed pairs
                (h_{i}, x_{i+1}) at i = c-1 .. c+m-2, taken from the same packed layout: packed
                token t carries hidden[t - 1] (the lane's carried h_{c-1} at its first token)
  8. scatter    rows of active lanes only; inactive lanes and unused capacity write nothing
                (their packed tokens belong to no row, so the KV scatters drop them)

Worked packing example, B = 3, W = 4, one prompt lane (mixed), lanes [decode, prompt, decode]:
  L = [2, 5, 4]  starts = [0, 2, 7]: 11 tokens of the packed extent C + (B-1)W = 5 + 2*4 = 13
  packed tokens: [x_c0, d0_0 | p0 p1 p2 p3 p4 | x_c2, d2_0, d2_1, d2_2 | pad pad]
  sample rows:   lane 0 at 0, 1; lane 1 at 6 (its last prompt token); lane 2 at 7..10
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from helios_jax.model import (
    ModelConfig,
    PackedBatch,
    PagedKVCache,
    compute_logits,
    draft_forward_packed,
    forward_packed,
)
from helios_jax.model.cache import packed_token_rows
from helios_jax.programs.acceptance import sample_and_accept
from helios_jax.programs.impls import Impl
from helios_jax.programs.inputs import RoundOutputs
from helios_jax.programs.processors import apply_processors, count_outputs
from helios_jax.programs.proposals import copy_only_proposals, draft_proposals
from helios_jax.programs.scores import prompt_logprobs, token_logprobs
from helios_jax.programs.state import DeviceState, wrap_keys
from helios_jax.programs.token_mask import apply_token_mask


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """Static extents of one round."""

    lanes: int  # B
    width: int  # W
    depth: int  # D (W - 1 <= D)
    packed: int  # T packed target capacity
    prompt_capacity: int  # C, 0 when no lane can carry a prompt
    maintain_draft: bool
    device_allocation: bool
    scored: bool = False  # also return the prompt tokens' log-probabilities and alternatives


@struct.dataclass
class RoundInputs:
    slots: jax.Array  # i32[B]
    active: jax.Array  # bool[B]
    page_tables: jax.Array  # i32[B, N]
    prompt_lane: jax.Array  # bool[B] at most one True (mixed); every lane of a B-row prefill
    lane_rows: jax.Array  # i32[B] query lengths (prompt lane: chunk length) or ceilings
    tokens: jax.Array  # i32[T] packed prompt tokens
    prompt_ends: jax.Array  # bool[] or bool[B] (per prompt lane): the chunk is the prompt's last
    copy_tokens: jax.Array  # i32[B, D]
    copy_lengths: jax.Array  # i32[B]
    token_mask: jax.Array | None = None  # i32[B, ceil(V/32)] (token_mask.py); None: no lane masked
    masked: jax.Array | None = None  # bool[B]


@struct.dataclass
class _Lanes:
    """Stage 1's gathered rows, lane order."""

    slots: jax.Array  # i32[B] clipped row ids
    active: jax.Array  # bool[B]
    is_prompt: jax.Array  # bool[B] the lane consumes a prompt chunk
    is_decode: jax.Array  # bool[B] the lane verifies its pending token (and proposals)
    cursor: jax.Array  # i32[B] c
    pending: jax.Array  # i32[B] x_c
    last_hidden: jax.Array  # [B, H] h_{c-1}
    temperature: jax.Array  # f32[B]
    top_k: jax.Array  # i32[B]
    top_p: jax.Array  # f32[B]
    keys: jax.Array  # typed keys [B, 4]: kept by the row, proposals, acceptance tests, final draw
    coupled: jax.Array  # bool[B] active lanes of seeded rows: keyed draws (RESOLUTIONS.md 30)
    seed_key: jax.Array  # typed keys [B] the row's key as stored: a coupled row's seed key
    logprobs: jax.Array  # bool[B] the row's request asked for generated tokens' scores (scores.py)
    generated: jax.Array  # i32[B] output tokens the row emitted before this round
    min_p: jax.Array  # f32[B] (processors.py; 0: off)


def _gather(state: DeviceState, x: RoundInputs, plan: RoundPlan) -> _Lanes:
    slots = jnp.clip(x.slots, 0, state.rows - 1)
    active = x.active.astype(bool)
    if plan.prompt_capacity:
        is_prompt = active & x.prompt_lane & (x.lane_rows > 0)  # an empty chunk does nothing
        is_decode = active & ~x.prompt_lane
    else:
        is_prompt, is_decode = jnp.zeros_like(active), active
    # Draws are indexed by position (fold_in) under per-purpose keys, so a lane's randomness
    # depends neither on the program's width nor on the other lanes: a mixed frame samples
    # exactly what the separate programs sample. A coupled row never advances its key: its
    # draws are keyed by (seed, absolute position) alone, so not even the number of rounds
    # that reached a position changes its token.
    seed_key = wrap_keys(state.rng[slots])
    keys = jax.vmap(lambda k: jax.random.split(k, 4))(seed_key)
    return _Lanes(
        slots=slots,
        active=active,
        is_prompt=is_prompt,
        is_decode=is_decode,
        cursor=state.cursor[slots],
        pending=state.pending[slots],
        last_hidden=state.last_hidden[slots],
        temperature=state.temperature[slots],
        top_k=state.top_k[slots],
        top_p=state.top_p[slots],
        keys=keys,
        coupled=active & state.coupled[slots],
        seed_key=seed_key,
        logprobs=state.logprobs[slots],
        generated=state.generated[slots],
        min_p=jnp.where(state.processors.enabled[slots], state.processors.min_p[slots], 0.0),
    )


def _allocate(lanes: _Lanes, x: RoundInputs, plan: RoundPlan, impl: Impl, joint, available) -> jax.Array:
    """i32[B] target rows: host lengths or the device prefix allocation for decode lanes (never
    beyond W or the lane's produced proposals + 1), the chunk length for the prompt lane."""
    decode_limit = jnp.minimum(plan.width, available + 1)
    if plan.device_allocation:
        ceilings = jnp.where(lanes.is_decode, jnp.clip(x.lane_rows, 1, decode_limit), 0).astype(jnp.int32)
        decode_rows = impl.allocate(joint, ceilings, lanes.is_decode, plan.packed)
    else:
        decode_rows = jnp.clip(x.lane_rows, 1, decode_limit)
    lens = jnp.where(lanes.is_decode, decode_rows, 0)
    if plan.prompt_capacity:
        lens = jnp.where(lanes.is_prompt, jnp.clip(x.lane_rows, 0, plan.prompt_capacity), lens)
    return lens.astype(jnp.int32)


def _pack_target(lanes: _Lanes, x: RoundInputs, plan: RoundPlan, proposals, lens) -> PackedBatch:
    """The packed verification batch: decode lanes' [x_c, d_0, ..] scattered at their offsets
    into the host's packed prompt tokens; positions from each covering lane's cursor."""
    t_cap = plan.packed
    starts = (jnp.cumsum(lens) - lens).astype(jnp.int32)
    column = jnp.arange(plan.width, dtype=jnp.int32)[None, :]
    grid = jnp.concatenate([lanes.pending[:, None], proposals], axis=1)  # [B, W]
    index = jnp.where(lanes.is_decode[:, None] & (column < lens[:, None]), starts[:, None] + column, t_cap)
    tokens = x.tokens.astype(jnp.int32).at[index].set(grid, mode="drop")
    token_lane, covered = packed_token_rows(starts, lens, t_cap)
    offset = jnp.arange(t_cap, dtype=jnp.int32) - starts[token_lane]
    positions = jnp.where(covered, lanes.cursor[token_lane] + offset, 0).astype(jnp.int32)
    return PackedBatch(
        tokens=tokens,
        positions=positions,
        page_tables=x.page_tables,
        context_lens=jnp.where(lens > 0, lanes.cursor + lens, 0).astype(jnp.int32),
        query_starts=starts,
        query_lens=lens,
    )


def _absorb(config, params, draft_cache, lanes: _Lanes, batch: PackedBatch, hidden, committed, attention):
    """Writes the committed pairs (h_i, x_{i+1}), i = c-1 .. c+m-2, into the MTP cache, reusing the
    target's packed layout shifted by one position: packed token t (x_{c+j}) pairs with
    hidden[t - 1] = h_{c+j-1}, or with the carried h_{c-1} at the lane's first token."""
    t_cap = hidden.shape[0]
    token_lane, _ = packed_token_rows(batch.query_starts, batch.query_lens, t_cap)
    carried = jnp.arange(t_cap) == batch.query_starts[token_lane]
    previous = jnp.concatenate([jnp.zeros_like(hidden[:1]), hidden[:-1]], axis=0)
    hidden_in = jnp.where(carried[:, None], lanes.last_hidden[token_lane].astype(hidden.dtype), previous)
    return absorb_pairs(
        config,
        params,
        draft_cache,
        hidden_in,
        (batch.tokens, batch.positions, batch.page_tables, batch.query_starts),
        lanes.cursor,
        committed,
        attention=attention,
    )


def absorb_pairs(
    config, params, draft_cache, hidden_in, layout, cursor, committed, *, attention
) -> PagedKVCache:
    """One packed MTP forward that enters each lane's committed pairs into the draft context.

    `layout` = (tokens, positions, page_tables, query_starts), the target's packing of the
    committed tokens: lane b's packed tokens from `query_starts[b]` are x_c .. x_{c+m-1} at target
    positions c .. c+m-1 (c = `cursor[b]`, m = `committed[b]`), and `hidden_in` pairs each with
    h_{i-1}, so the pair (h_{i-1}, x_i) enters the draft context at position i - 1. A lane whose
    first chunk this is (c = 0) has no pair at position -1: its first token is skipped. Shared by
    a round's absorb (`_absorb`) and a K-step width-one program's (`multistep._absorb_steps`)."""
    tokens, positions, page_tables, query_starts = layout
    first = (cursor == 0).astype(jnp.int32)
    d_lens = jnp.where(committed > 0, committed - first, 0).astype(jnp.int32)
    d_batch = PackedBatch(
        tokens=tokens,
        positions=jnp.maximum(positions - 1, 0),
        page_tables=page_tables,
        context_lens=jnp.where(d_lens > 0, cursor + committed - 1, 0).astype(jnp.int32),
        query_starts=(query_starts + first).astype(jnp.int32),
        query_lens=d_lens,
    )
    _, draft_cache = draft_forward_packed(
        config, params, draft_cache, hidden_in, d_batch, attention=attention
    )
    return draft_cache


def _sidecar(lanes: _Lanes, confidence, joint, shape: tuple[int, int]) -> jax.Array:
    """f32[2, S, draft_capacity]: rows of the cohort's decode lanes, zeros elsewhere."""
    slots_total, draft_capacity = shape
    sidecar = jnp.zeros((2, slots_total, draft_capacity), jnp.float32)
    d = confidence.shape[1]
    if d == 0:
        return sidecar
    rows = jnp.where(lanes.is_decode & (lanes.slots < slots_total), lanes.slots, slots_total)
    sidecar = sidecar.at[0, rows, :d].set(confidence, mode="drop")
    return sidecar.at[1, rows, :d].set(joint, mode="drop")


def _scatter_rows(array: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
    return array.at[rows].set(values.astype(array.dtype), mode="drop")


@struct.dataclass
class _Drafts:
    """Stage 2's proposals, lane order (empty extents when the round draws none)."""

    cache: PagedKVCache | None  # the MTP cache with the provisional entries (None: no draft head)
    proposals: jax.Array  # i32[B, W-1] the proposals the verification rows carry
    q: jax.Array  # f32[B, W-1, V] the distribution each proposal was drawn from
    available: jax.Array  # i32[B] proposals produced per lane
    confidence: jax.Array  # f32[B, D] draft confidence of each proposal, 0 for non-decode lanes
    joint: jax.Array  # f32[B, D] joint prefix probabilities: cumulative products of confidence


def packed_round(
    config: ModelConfig,
    params,
    state: DeviceState,
    x: RoundInputs,
    plan: RoundPlan,
    impl: Impl,
    *,
    sidecar_shape: tuple[int, int],
):
    """Runs one round (module docstring).

    Returns:
      (state, RoundOutputs, the prompt scores when plan.scored else None: a dict of
      `scores.prompt_logprobs`' PrefillOutputs fields).
    """
    attention = impl.attention_kernel()
    lanes = _gather(state, x, plan)  # 1
    next_key, propose_key, accept_key, sample_key = (lanes.keys[:, i] for i in range(4))
    drafts = _propose(config, params, state.draft, lanes, x, plan, propose_key, attention)  # 2

    lens = _allocate(lanes, x, plan, impl, drafts.joint, drafts.available)  # 3
    batch = _pack_target(lanes, x, plan, drafts.proposals, lens)  # 4. one packed target forward
    hidden, target_cache = forward_packed(config, params, state.target, batch, attention=attention)
    column = jnp.arange(plan.width, dtype=jnp.int32)[None, :]  # i32[1, W] a lane's row index
    logits, sampled = _sample_logits(config, params, state, lanes, x, plan, hidden, batch, drafts, column)
    acc, counts = _accept(lanes, x, plan, batch, drafts, column, sampled, accept_key, sample_key)  # 5
    committed, new_hidden, new_pending = _commit(lanes, hidden, batch, acc, counts, plan)  # 6

    draft_cache = drafts.cache
    if plan.maintain_draft and draft_cache is not None:  # 7
        draft_cache = _absorb(config, params, draft_cache, lanes, batch, hidden, committed, attention)

    rows = jnp.where(lanes.active, lanes.slots, state.rows)  # 8. only active lanes write
    tokens = jnp.where(column < counts[:, None], acc.tokens, 0).astype(jnp.int32)
    new_state = state.replace(
        target=target_cache,
        draft=draft_cache,
        cursor=_scatter_rows(state.cursor, rows, lanes.cursor + committed),
        pending=_scatter_rows(state.pending, rows, new_pending),
        last_hidden=_scatter_rows(state.last_hidden, rows, new_hidden),
        rng=_scatter_rows(state.rng, rows, _next_key_data(lanes, next_key)),
        generated=_scatter_rows(state.generated, rows, state.generated[lanes.slots] + counts),
        processors=count_outputs(state.processors, lanes.slots, lanes.active, tokens, counts),
    )
    outputs = RoundOutputs(
        tokens=tokens,
        counts=counts,
        query_lengths=lens,
        sidecar=_sidecar(lanes, drafts.confidence, drafts.joint, sidecar_shape),
        survival=jnp.where(lanes.is_decode[:, None], acc.survival, 0.0),
        **token_logprobs(logits, tokens, lanes.active & lanes.logprobs),
    )
    prompt_scores = _prompt_scores(config, params, hidden, batch, lanes) if plan.scored else None
    return new_state, outputs, prompt_scores


def _prompt_scores(config, params, hidden, batch: PackedBatch, lanes: _Lanes) -> dict:
    """The scored prefill's prompt fields (`scores.prompt_logprobs`) for its prompt lane."""
    lane = jnp.argmax(lanes.is_prompt)
    present, first = jnp.any(lanes.is_prompt), lanes.cursor[lane] == 0
    return prompt_logprobs(config, params, hidden, batch, lanes.last_hidden[lane], lane, present, first)


def _next_key_data(lanes: _Lanes, next_key) -> jax.Array:
    """u32[B, 2] each row's stored key after the round: advanced, or the seed key when coupled."""
    seed_data = jax.random.key_data(lanes.seed_key)
    return jnp.where(lanes.coupled[:, None], seed_data, jax.random.key_data(next_key))


def _propose(
    config, params, draft_cache, lanes: _Lanes, x: RoundInputs, plan: RoundPlan, key, attention
) -> _Drafts:
    """Stage 2: D > 0 sequential MTP proposals for the decode lanes (`proposals.py`; a model
    without an MTP head: the copy prefixes alone), cut to the W - 1 that verification rows carry;
    empty proposals (and the cache untouched) when D = 0."""
    b, w, d = plan.lanes, plan.width, plan.depth
    if d > 0 and not config.has_mtp:  # no draft head: copy lanes propose their prefixes alone
        props = copy_only_proposals(
            active=lanes.is_decode,
            copy_tokens=x.copy_tokens,
            copy_lengths=x.copy_lengths,
            depth=d,
            vocab=config.vocab_size,
        )
    elif d > 0:
        props = draft_proposals(
            config,
            params,
            draft_cache,
            hidden=lanes.last_hidden,
            pending=lanes.pending,
            cursor=lanes.cursor,
            page_tables=x.page_tables,
            active=lanes.is_decode,
            temperature=lanes.temperature,
            top_k=lanes.top_k,
            top_p=lanes.top_p,
            key=key,
            copy_tokens=x.copy_tokens,
            copy_lengths=x.copy_lengths,
            depth=d,
            attention=attention,
            coupled=lanes.coupled,
            noise_key=lanes.seed_key,
        )
    if d > 0:
        draft_cache = props.cache
        confidence = jnp.where(lanes.is_decode[:, None], props.confidence, 0.0)
        proposals, q, available = props.tokens[:, : w - 1], props.probs[:, : w - 1], props.available
    else:
        confidence = jnp.zeros((b, 0), jnp.float32)
        proposals = jnp.zeros((b, w - 1), jnp.int32)
        q = jnp.zeros((b, w - 1, config.vocab_size), jnp.float32)
        available = jnp.zeros((b,), jnp.int32)
    return _Drafts(
        cache=draft_cache,
        proposals=proposals,
        q=q,
        available=available,
        confidence=confidence,
        joint=jnp.cumprod(confidence, axis=1),
    )


def _sample_logits(
    config, params, state: DeviceState, lanes: _Lanes, x: RoundInputs, plan, hidden, batch, drafts, column
):
    """(raw target logits f32[B, W, V] at each decode lane's W rows and at the prompt lane's last
    token, the logits the draw sees: the token mask and the rows' processors applied)."""
    t_cap = plan.packed
    starts, lens = batch.query_starts, batch.query_lens
    # The prompt lane samples at its last prompt token, a decode lane at each of its W rows.
    sample_index = jnp.where(
        lanes.is_prompt[:, None], starts[:, None] + lens[:, None] - 1, starts[:, None] + column
    )
    logits = compute_logits(config, params, hidden[jnp.clip(sample_index, 0, t_cap - 1)])  # f32[B, W, V]
    sampled = logits  # what the draw sees; the scores keep the raw model distribution
    if x.token_mask is not None:
        sampled = apply_token_mask(sampled, x.token_mask, x.masked.astype(bool), lanes.active)
    # A prompt lane's row 0 follows no proposal; a decode lane's row j follows d_0..d_{j-1}.
    proposals = jnp.where(lanes.is_decode[:, None], drafts.proposals, 0)
    sampled = apply_processors(
        sampled, state.processors, lanes.slots, lanes.active, lanes.generated, proposals
    )
    return logits, sampled


def _accept(
    lanes: _Lanes,
    x: RoundInputs,
    plan: RoundPlan,
    batch: PackedBatch,
    drafts: _Drafts,
    column,
    sampled,
    accept_key,
    sample_key,
):
    """Stage 5: greedy/rejection acceptance (`acceptance.py`) over the processed target logits
    `sampled` f32[B, W, V]; the prompt lane just samples.

    Returns:
      (the acceptance result, i32[B] tokens each lane emits: a + 1 for a decode lane, one for a
      prompt lane whose chunk ends the prompt, none otherwise).
    """
    b, w = plan.lanes, plan.width
    lens = batch.query_lens

    def per_row(values):  # a lane's setting for each of its W rows
        return jnp.broadcast_to(values[:, None], (b, w))

    settings = (per_row(lanes.temperature), per_row(lanes.top_k), per_row(lanes.top_p))
    rows = jnp.where(lanes.is_decode, lens, 1)
    # Row j samples the token at absolute position c + j + 1 (decode: after x_c and j drafts);
    # the prompt lane samples the token after its chunk, at c + len. Coupled lanes key their
    # noise by it, so every program kind draws the same token at a position.
    positions = lanes.cursor[:, None] + jnp.where(lanes.is_prompt[:, None], lens[:, None], column + 1)
    # All-greedy live lanes skip the softmax/inverse-CDF work (same tokens: `sample_and_accept`).
    acc = sample_and_accept(
        sampled,
        *settings,
        drafts.q,
        drafts.proposals,
        rows,
        accept_key,
        sample_key,
        live=lanes.active,
        coupled=lanes.coupled,
        noise_key=lanes.seed_key,
        positions=positions.astype(jnp.int32),
        min_p=per_row(lanes.min_p),
    )
    counts = jnp.where(lanes.is_decode, acc.counts, 0)
    if plan.prompt_capacity:
        counts = jnp.where(lanes.is_prompt & x.prompt_ends, 1, counts)
    return acc, counts.astype(jnp.int32)


def _commit(lanes: _Lanes, hidden, batch: PackedBatch, acc, counts, plan: RoundPlan):
    """Stage 6: m committed tokens per lane (a + 1 for a decode lane, the chunk for the prompt
    lane); the lane's new pending token and carried hidden state h_{c+m-1}.

    Returns:
      (committed i32[B], new carried hidden [B, H], new pending i32[B]).
    """
    w, t_cap = plan.width, plan.packed
    lens = batch.query_lens
    committed = jnp.where(lanes.is_decode, acc.accepted + 1, jnp.where(lanes.is_prompt, lens, 0))
    committed = committed.astype(jnp.int32)
    new_hidden = hidden[jnp.clip(batch.query_starts + committed - 1, 0, t_cap - 1)]
    new_hidden = jnp.where((committed > 0)[:, None], new_hidden, lanes.last_hidden)
    last_token = jnp.take_along_axis(acc.tokens, jnp.clip(counts - 1, 0, w - 1)[:, None], axis=1)[:, 0]
    new_pending = jnp.where(counts > 0, last_token, lanes.pending)
    return committed, new_hidden, new_pending
