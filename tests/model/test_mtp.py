"""The MTP draft head equals the naive numpy oracle (reference/mtp.py) on every path:

- the full-sequence head (`draft_forward_full`) against `mtp_forward`;
- the draft context absorbed through the paged cache in packed chunks;
- D sequential proposals (`paged_proposals`, one scan over paged steps) against `naive_proposals`,
  which recomputes the whole draft sequence per proposal: greedy exactly, sampled by
  teacher-forcing the oracle with the sampled tokens and comparing distributions;
- width-one decoding that maintains the draft context pair by pair, then resumes proposals.

Target hidden states come from the package's full forward (itself checked against transformers
and against reference/qwen3.py), so both sides of every comparison see the same inputs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.model import (
    draft_forward_full,
    draft_forward_packed,
    forward_full,
    forward_packed,
    init_paged_cache,
    tiny_config,
)
from helios_jax.model.forward import compute_logits
from helios_jax.reference.mtp import mtp_forward, naive_proposals, paged_proposals
from helios_jax.reference.qwen3 import qwen3_forward

from .helpers import PagePool, hf_weights, max_abs, pack_step, random_params

PAGE_SIZE = 4
CAPACITY = 16

CONFIGS = {
    "untied": tiny_config(mtp_num_layers=1),
    "tied_gqa4": tiny_config(mtp_num_layers=1, num_kv_heads=1, tie_word_embeddings=True),
}

full_hidden = jax.jit(forward_full, static_argnums=0)
draft_full = jax.jit(draft_forward_full, static_argnums=0)
logits_of = jax.jit(compute_logits, static_argnums=0)
draft_step = jax.jit(draft_forward_packed, static_argnums=0, static_argnames="attention", donate_argnums=2)
target_step = jax.jit(forward_packed, static_argnums=0, static_argnames="attention", donate_argnums=2)
propose_jit = jax.jit(
    paged_proposals,
    static_argnums=0,
    static_argnames=("depth", "return_probs", "attention"),
    donate_argnums=2,
)


def _setup(config_name, seed, lengths):
    config = CONFIGS[config_name]
    params = random_params(config, seed=seed)
    rng = np.random.default_rng(seed + 100)
    seqs = [rng.integers(0, config.vocab_size, size=n).astype(np.int32) for n in lengths]
    hiddens = [np.asarray(full_hidden(config, params, jnp.asarray(s))) for s in seqs]
    return config, params, seqs, hiddens


def _absorb_context(config, params, seqs, hiddens, context, pool, chunks):
    """Writes the draft context pairs (h_i, x_{i+1}), i < context[r], through packed steps of
    `chunks[k][r]` pairs per row. Returns the MTP cache and each row's draft hidden states."""
    cache = init_paged_cache(
        config,
        total_pages=pool.total_pages,
        page_size=PAGE_SIZE,
        num_layers=config.mtp_num_layers,
        fill=np.nan,
    )
    nexts = [s[1:] for s in seqs]  # pair i carries the token at i + 1
    done = [0] * len(seqs)
    drafts = [[] for _ in seqs]
    for step, feed in enumerate(chunks):
        lengths = [d + f for d, f in zip(done, feed)]
        batch = pack_step(nexts, done, feed, CAPACITY, pool.tables_for(lengths), seed=step)
        packed_hidden = np.zeros((CAPACITY, config.hidden_size), np.float32)
        starts = np.asarray(batch.query_starts)
        for r, n in enumerate(feed):
            packed_hidden[starts[r] : starts[r] + n] = hiddens[r][done[r] : done[r] + n]
        out, cache = draft_step(config, params, cache, jnp.asarray(packed_hidden), batch)
        for r, n in enumerate(feed):
            drafts[r].append(np.asarray(out)[starts[r] : starts[r] + n])
        done = lengths
    assert done == list(context)
    return cache, [np.concatenate(d) if d else None for d in drafts]


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_full_sequence_head_matches_naive_reference(config_name):
    config, params, (seq,), (hidden,) = _setup(config_name, seed=1, lengths=[12])
    weights = hf_weights(params)
    # The target itself against the naive numpy forward (reads transformers' tensor names).
    ref_hidden, ref_logits = qwen3_forward(weights, config, seq)
    assert max_abs(hidden, ref_hidden) <= 1e-4
    assert max_abs(logits_of(config, params, jnp.asarray(hidden)), ref_logits) <= 1e-4

    draft = draft_full(config, params, jnp.asarray(hidden[:-1]), jnp.asarray(seq[1:]))
    want_hidden, want_logits = mtp_forward(weights, config, hidden[:-1], seq[1:])
    assert max_abs(draft, want_hidden) <= 1e-4
    assert max_abs(logits_of(config, params, draft), want_logits) <= 1e-4


def test_paged_draft_context_matches_naive_reference():
    """Three rows absorb 10, 3 and 13 context pairs in chunks (one row idle at first)."""
    context = (10, 3, 13)
    config, params, seqs, hiddens = _setup("untied", seed=2, lengths=[n + 1 for n in context])
    weights = hf_weights(params)
    pool = PagePool(rows=3, max_len=16, page_size=PAGE_SIZE, seed=3)
    chunks = [(5, 3, 0), (4, 0, 6), (1, 0, 7)]
    _, drafts = _absorb_context(config, params, seqs, hiddens, context, pool, chunks)
    for r, n in enumerate(context):
        want, _ = mtp_forward(weights, config, hiddens[r][:n], seqs[r][1 : n + 1])
        assert max_abs(drafts[r], want) <= 1e-4


def _proposal_case(config_name, seed, sampled):
    """Rows with draft contexts of 6, 9 and 4 pairs (row 1 inactive for the proposal), then
    D = 4 proposals from each active row's last position."""
    depth = 4
    context = (6, 9, 4)  # pairs already absorbed; proposals start at position context[r]
    active = np.array([True, False, True])
    config, params, seqs, hiddens = _setup(config_name, seed=seed, lengths=[n + 2 for n in context])
    pool = PagePool(rows=3, max_len=max(context) + depth, page_size=PAGE_SIZE, seed=seed)
    cache, _ = _absorb_context(config, params, seqs, hiddens, context, pool, [(6, 0, 4), (0, 9, 0)])
    p = np.array(context)
    out = propose_jit(
        config,
        params,
        cache,
        jnp.asarray(np.stack([hiddens[r][p[r]] for r in range(3)])),
        jnp.asarray(np.array([seqs[r][p[r] + 1] for r in range(3)])),
        jnp.asarray(p.astype(np.int32)),
        jnp.asarray(pool.tables_for(p + depth)),
        jnp.asarray(active),
        depth=depth,
        key=jax.random.key(seed) if sampled else None,
        temperature=0.7 if sampled else 1.0,
        return_probs=sampled,
    )
    return config, params, seqs, hiddens, context, active, depth, out


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_greedy_proposals_equal_naive_loop(config_name):
    config, params, seqs, hiddens, context, active, depth, out = _proposal_case(
        config_name, seed=4, sampled=False
    )
    weights = hf_weights(params)
    tokens, probs = np.asarray(out.tokens), np.asarray(out.token_probs)
    assert tokens.shape == probs.shape == (3, depth)
    for r, n in enumerate(context):
        if not active[r]:
            assert np.all(tokens[r] == 0) and np.all(probs[r] == 0)
            continue
        want_tokens, want_probs = naive_proposals(
            weights, config, hiddens[r][: n + 1], seqs[r][1 : n + 2], depth
        )
        np.testing.assert_array_equal(tokens[r], want_tokens)
        assert max_abs(probs[r], want_probs) <= 1e-5


def test_sampled_proposals_follow_their_draft_distributions():
    """Sampled proposals: the oracle, forced to pick the same tokens, sees the same tempered
    distributions; q is the chosen token's probability; the key fixes the result."""
    config, params, seqs, hiddens, context, active, depth, out = _proposal_case(
        "untied", seed=5, sampled=True
    )
    weights = hf_weights(params)
    tokens, probs, dists = map(np.asarray, (out.tokens, out.token_probs, out.probs))
    assert dists.shape == (3, depth, config.vocab_size)
    for r, n in enumerate(context):
        if not active[r]:
            continue
        seen = []

        def choose(k, p, r=r, seen=seen):
            seen.append(p)
            return tokens[r, k]

        naive_proposals(
            weights,
            config,
            hiddens[r][: n + 1],
            seqs[r][1 : n + 2],
            depth,
            choose=choose,
            temperature=0.7,
        )
        assert max_abs(dists[r], np.stack(seen)) <= 1e-5
        np.testing.assert_allclose(probs[r], dists[r][np.arange(depth), tokens[r]], rtol=1e-6)
    again = _proposal_case("untied", seed=5, sampled=True)[-1]
    np.testing.assert_array_equal(np.asarray(again.tokens), tokens)


@pytest.mark.spec("speculative-coverage/width-one-draft-context")
def test_width_one_decoding_keeps_the_draft_context_for_wider_rounds():
    """Two rows decode width-one (one target token per step, no proposals). After each step the
    draft head absorbs the pair that became complete, (h_{i-1}, x_i) at position i - 1. Then a
    wider round resumes: D = 3 proposals equal the naive oracle over the whole context."""
    config = CONFIGS["untied"]
    params = random_params(config, seed=6)
    weights = hf_weights(params)
    prompt_lengths, steps, depth = (5, 3), 6, 3
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, config.vocab_size, size=n + steps).astype(np.int32) for n in prompt_lengths]
    pool = PagePool(rows=2, max_len=max(prompt_lengths) + steps + depth, page_size=PAGE_SIZE, seed=8)
    target = init_paged_cache(config, total_pages=pool.total_pages, page_size=PAGE_SIZE, fill=np.nan)
    draft = init_paged_cache(
        config,
        total_pages=pool.total_pages,
        page_size=PAGE_SIZE,
        num_layers=config.mtp_num_layers,
        fill=np.nan,
    )
    hidden_of = [[None] * len(s) for s in seqs]  # target hidden per position, as produced

    def target_feed(done, feed):
        nonlocal target
        lengths = [d + f for d, f in zip(done, feed)]
        batch = pack_step(seqs, done, feed, CAPACITY, pool.tables_for(lengths))
        hidden, target = target_step(config, params, target, batch)
        starts = np.asarray(batch.query_starts)
        for r, n in enumerate(feed):
            for i in range(n):
                hidden_of[r][done[r] + i] = np.asarray(hidden[starts[r] + i])

    def draft_absorb(done, feed):
        """Pairs (h_i, x_{i+1}) for i in [done[r], done[r] + feed[r])."""
        nonlocal draft
        nexts = [s[1:] for s in seqs]
        lengths = [d + f for d, f in zip(done, feed)]
        batch = pack_step(nexts, done, feed, CAPACITY, pool.tables_for(lengths))
        packed = np.zeros((CAPACITY, config.hidden_size), np.float32)
        starts = np.asarray(batch.query_starts)
        for r, n in enumerate(feed):
            for i in range(n):
                packed[starts[r] + i] = hidden_of[r][done[r] + i]
        _, draft = draft_step(config, params, draft, jnp.asarray(packed), batch)

    # Prefill the prompts; the draft absorbs the prompt's complete pairs (all but the last).
    target_feed([0, 0], list(prompt_lengths))
    draft_absorb([0, 0], [n - 1 for n in prompt_lengths])
    # Width-one steps: the token at position n enters the target; the pair (h_{n-1}, x_n)
    # is now complete and enters the draft context.
    length = list(prompt_lengths)
    for _ in range(steps - 1):
        target_feed(length, [1, 1])
        draft_absorb([n - 1 for n in length], [1, 1])
        length = [n + 1 for n in length]
    # A wider round from position p = length - 1 with the pending token x_{p+1}.
    p = np.array(length) - 1
    out = propose_jit(
        config,
        params,
        draft,
        jnp.asarray(np.stack([hidden_of[r][p[r]] for r in range(2)])),
        jnp.asarray(np.array([seqs[r][p[r] + 1] for r in range(2)])),
        jnp.asarray(p.astype(np.int32)),
        jnp.asarray(pool.tables_for(p + depth)),
        jnp.asarray(np.array([True, True])),
        depth=depth,
    )
    for r in range(2):
        full = np.asarray(full_hidden(config, params, jnp.asarray(seqs[r][: p[r] + 1])))
        want, _ = naive_proposals(weights, config, full, seqs[r][1 : p[r] + 2], depth)
        np.testing.assert_array_equal(np.asarray(out.tokens)[r], want)


def test_the_old_model_propose_names_still_resolve_with_a_deprecation_warning():
    """`propose` and `Proposals` moved from helios_jax.model(.mtp) to the oracle module
    helios_jax.reference.mtp (`paged_proposals`); the old names still resolve there, and warn."""
    import helios_jax.model.mtp as old_mtp
    from helios_jax import model
    from helios_jax.reference import mtp as oracle

    with pytest.warns(DeprecationWarning, match="reference.mtp.paged_proposals"):
        assert model.propose is oracle.paged_proposals
    with pytest.warns(DeprecationWarning, match="reference.mtp.paged_proposals"):
        assert old_mtp.propose is oracle.paged_proposals
    with pytest.warns(DeprecationWarning, match="reference.mtp.Proposals"):
        assert model.Proposals is oracle.Proposals
