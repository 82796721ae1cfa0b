"""Per-row sampling distributions and draws, vectorised and free of host round trips.

A row's sampling settings (temperature, top_k, top_p) turn logits into the distribution that is
actually sampled. The same transformation serves the target (p) and the draft (q), so that
rejection sampling compares the distributions the tokens were really drawn from:

  temperature == 0  greedy: the one-hot distribution of the first argmax. Greedy decoding is then
                    the special case of the acceptance rule where p and q are point masses
                    (accept iff the proposal is the target argmax; replacement = the argmax).
  temperature > 0   softmax(logits / temperature), then
                    min_p > 0 (target rows only): keep tokens whose probability is >= min_p times
                    the largest (vLLM's order: after temperature, before top-k/top-p),
                    top_k > 0: keep tokens whose probability is >= the k-th largest,
                    top_p < 1: keep the smallest most-probable set whose mass reaches top_p
                    (the token that crosses top_p is kept),
                    renormalised. Ties at a threshold keep every tied token.

Draws use the inverse CDF with an explicit uniform u in [0, 1): the token is the first index
whose cumulative mass exceeds u * total. Zero-probability tokens are never drawn, and the same
uniform gives the same token in the numpy oracle (reference/sampling.py).

Greedy fast path: a one-hot row's inverse-CDF draw is its argmax whatever the uniform, so when
every live row of a batch is greedy (`greedy_only`) the programs take the argmax and skip the
softmax, the truncation test, the cumulative sums and the uniforms (`draw`,
`acceptance.sample_and_accept`): one `lax.cond` whose other branch is the full path unchanged,
so both give the same bits (tests/programs/test_sampling_greedy.py).

Coupled draws (seeded requests, docs/spec/RESOLUTIONS.md 30): the token at absolute position t
is the Gumbel-max draw argmax_v(log p_v + G_v) with G = `position_noise(key, t)`, noise keyed
by the row's seed and t alone. It is an exact draw from p (the same filtered, tempered
distribution as the inverse-CDF path), and a draft drawn from q with the same noise is accepted
exactly when it equals the target's token (`acceptance.accept_coupled`): the emitted token at
t is then a function of (seed, t, the context) whatever drafted it or whatever width verified it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp

PyTree = TypeVar("PyTree")


def first_argmax(x: jax.Array) -> jax.Array:
    """i32[...] the first index of the largest entry along the last axis, exactly `jnp.argmax`'s
    answer (a NaN counts as the largest, the first NaN wins; ties go to the first index).

    `jnp.argmax` lowers to one reduction over (value, index) pairs, which XLA's CPU compiler
    runs as a scalar loop: 0.16 ms over a 16 x 4,096 block, against 0.07 ms for these three
    plain reductions (max, any NaN, first hit), which it vectorises. Every vocabulary-wide
    argmax of the programs (greedy tokens, Gumbel-max draws) goes through here."""
    nan = jnp.isnan(x)
    top = jnp.max(x, axis=-1, keepdims=True)  # on a CPU a NaN need not survive this max
    hit = jnp.where(jnp.any(nan, axis=-1, keepdims=True), nan, x == top)
    return jnp.min(jnp.where(hit, jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[-1]), axis=-1)


def greedy_only(temperature: jax.Array, live: jax.Array | None = None) -> jax.Array:
    """bool[]: every live row is greedy (temperature <= 0). Rows outside `live` (bool, broadcast
    against temperature; None: all rows) are ignored: their results must be unused."""
    greedy = temperature <= 0
    if live is not None:  # live: the leading axes of temperature (a lane's W rows share it)
        live = live.reshape(live.shape + (1,) * (greedy.ndim - live.ndim))
        greedy = greedy | ~live
    return jnp.all(greedy)


def sampling_probs(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array | None = None,
) -> jax.Array:
    """The distribution a row samples from.

    Args:
      logits: f32[..., V].
      temperature, top_p: f32[...] per row (broadcast against logits' leading axes).
      top_k: i32[...] per row.
      min_p: f32[...] per row (None: off everywhere).
    Returns:
      f32[..., V] probabilities (one-hot where temperature == 0).
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    cut = (top_k > 0) | (top_p < 1.0) if min_p is None else (top_k > 0) | (top_p < 1.0) | (min_p > 0)
    truncated = jnp.any((temperature > 0) & cut)
    temperature = temperature[..., None]
    greedy = temperature <= 0
    onehot = jax.nn.one_hot(first_argmax(logits), vocab, dtype=jnp.float32)
    probs = jax.nn.softmax(logits / jnp.where(greedy, 1.0, temperature), axis=-1)
    # The two full-vocabulary sorts below are the cost of truncation: skip them (same result)
    # when no sampled row truncates.
    probs = jax.lax.cond(truncated, lambda p: _truncate(p, top_k, top_p, min_p), lambda p: p, probs)
    return jnp.where(greedy, onehot, probs)


def _truncate(probs: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array | None) -> jax.Array:
    """min-p, top-k, then top-p, each renormalised (rows with min_p == 0, top_k == 0 and
    top_p == 1 are unchanged)."""
    vocab = probs.shape[-1]
    if min_p is not None:
        floor = min_p[..., None] * jnp.max(probs, axis=-1, keepdims=True)
        kept = jnp.where(probs < floor, 0.0, probs)
        # Rows without min_p keep their exact bits (no renormalisation round trip).
        probs = jnp.where(min_p[..., None] > 0, kept / jnp.sum(kept, axis=-1, keepdims=True), probs)
    # top-k: threshold at the k-th largest probability.
    descending = -jnp.sort(-probs, axis=-1)
    k = jnp.clip(top_k[..., None], 1, vocab)
    kth = jnp.take_along_axis(descending, k - 1, axis=-1)
    probs = jnp.where((top_k[..., None] > 0) & (probs < kth), 0.0, probs)
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
    # top-p: keep the sorted prefix up to and including the token whose mass crosses top_p.
    descending = -jnp.sort(-probs, axis=-1)
    before = jnp.cumsum(descending, axis=-1) - descending  # mass strictly before each entry
    keep_count = jnp.maximum(jnp.sum(before < top_p[..., None], axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(descending, keep_count - 1, axis=-1)
    probs = jnp.where((top_p[..., None] < 1.0) & (probs < threshold), 0.0, probs)
    return probs / jnp.sum(probs, axis=-1, keepdims=True)


def confidence_probs(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """The draft confidence distribution: softmax(logits / T), T = 1 for greedy rows.

    Untruncated (no top-k/top-p) and never one-hot, so a greedy proposal's confidence is the
    draft model's probability of its argmax rather than a meaningless 1.
    """
    t = temperature[..., None]
    return jax.nn.softmax(logits.astype(jnp.float32) / jnp.where(t <= 0, 1.0, t), axis=-1)


def sample_inverse_cdf(probs: jax.Array, uniform: jax.Array) -> jax.Array:
    """i32[...] draws from f32[..., V] (unnormalised is fine) with uniforms f32[...] in [0, 1)."""
    cdf = jnp.cumsum(probs, axis=-1)
    target = uniform[..., None] * cdf[..., -1:]
    index = jnp.sum(cdf <= target, axis=-1)
    return jnp.minimum(index, probs.shape[-1] - 1).astype(jnp.int32)


def position_noise(key: jax.Array, position: jax.Array, vocab: int) -> jax.Array:
    """f32[..., V] standard Gumbel noise for typed keys [...] at absolute positions i32[...]:
    a function of (key, position) alone, so the target and the draft, and every program that
    samples position t, see the same noise there."""
    flat_keys, flat_pos = key.reshape(-1), position.reshape(-1)
    noise = jax.vmap(lambda k, t: jax.random.gumbel(jax.random.fold_in(k, t), (vocab,), jnp.float32))(
        flat_keys, flat_pos
    )
    return noise.reshape(position.shape + (vocab,))


def gumbel_max(probs: jax.Array, noise: jax.Array) -> jax.Array:
    """i32[...] argmax_v(log probs_v + noise_v): an exact draw from f32[..., V] probs (zero
    entries are -inf, never drawn; a one-hot row gives its token)."""
    scores = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)) + noise, -jnp.inf)
    return first_argmax(scores)


def per_row_choice(
    coupled: jax.Array,
    plain: Callable[[], PyTree],
    keyed: Callable[[], PyTree],
    live: jax.Array | None = None,
) -> PyTree:
    """keyed()'s rows where `coupled` (bool[B], the leading axis of every leaf), plain()'s rows
    elsewhere. Only the branches some live row needs run (rows outside `live`, bool[B], None: all
    rows, may take either and must be unused)."""
    live = jnp.ones_like(coupled) if live is None else live

    def both(_):
        def pick(a, b):
            return jnp.where(coupled.reshape(coupled.shape + (1,) * (a.ndim - 1)), b, a)

        return jax.tree_util.tree_map(pick, plain(), keyed())

    case = jnp.any(coupled & live).astype(jnp.int32) + jnp.all(coupled | ~live).astype(jnp.int32)
    return jax.lax.switch(case, (lambda _: plain(), both, lambda _: keyed()), None)


def coupled_or_inverse_cdf(
    probs: jax.Array,
    uniform: Callable[[], jax.Array],
    coupled: jax.Array | None,
    noise: Callable[[], jax.Array] | None,
    live: jax.Array | None = None,
) -> jax.Array:
    """i32[B] draws from f32[B, V] probs: the Gumbel-max draw with `noise()` where coupled
    (bool[B]), the inverse-CDF draw with `uniform()` elsewhere (`per_row_choice`)."""
    if coupled is None or noise is None:
        return sample_inverse_cdf(probs, uniform())
    return per_row_choice(
        coupled, lambda: sample_inverse_cdf(probs, uniform()), lambda: gumbel_max(probs, noise()), live
    )


def draw(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    uniform: Callable[[], jax.Array],
    live: jax.Array | None = None,
    coupled: jax.Array | None = None,
    noise: Callable[[], jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(i32[...] tokens, f32[..., V] the distributions they were drawn from): the inverse-CDF draw
    `sample_inverse_cdf(sampling_probs(...), uniform())` (or, for rows in `coupled`, bool[...],
    the Gumbel-max draw with `noise()`, f32[..., V]), or just the argmax and its one-hot when
    every live row is greedy (`greedy_only`; rows outside `live` then differ and must be unused).
    `uniform` and `noise` are built inside the full branch only."""

    def greedy(logits):
        token = first_argmax(logits.astype(jnp.float32))
        return token.astype(jnp.int32), jax.nn.one_hot(token, logits.shape[-1], dtype=jnp.float32)

    def full(logits):
        probs = sampling_probs(logits, temperature, top_k, top_p)
        return coupled_or_inverse_cdf(probs, uniform, coupled, noise, live), probs

    return jax.lax.cond(greedy_only(temperature, live), greedy, full, logits)
