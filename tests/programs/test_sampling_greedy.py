"""The all-greedy fast path gives the bits the full sampling path gives.

- `sample_and_accept` on an all-greedy batch (argmax only) equals `accept_proposals` on
  `sampling_probs` with any uniforms: tokens, counts, accepted and survival, for one-hot and for
  arbitrary draft distributions, with ties in the logits (first argmax) and every length.
- A mixed batch (one sampled lane) takes the full path: equal to the unfused computation with
  the uniforms drawn from the same keys. A sampled lane outside `live` does not stop the fast path.
- `draw` on an all-greedy batch equals the inverse-CDF draw from `sampling_probs`, and a mixed
  batch equals it draw for draw.
- The fast branch really is cheap: it has no exp and no cumulative sum.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.programs.acceptance import accept_proposals, sample_and_accept
from helios_jax.programs.sampling import draw, first_argmax, sample_inverse_cdf, sampling_probs

B, W, V = 6, 4, 11


def _logits(seed: int) -> jax.Array:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, W, V)).astype(np.float32)
    logits[0, :, 3] = logits[0, :, 7] = logits[0].max() + 1.0  # a tie: the first argmax wins
    return jnp.asarray(logits)


def _drafts(seed: int, logits: jax.Array, one_hot: bool):
    """Proposals matching the target argmax for a random prefix, q one-hot or arbitrary."""
    rng = np.random.default_rng(seed + 1)
    target = np.asarray(jnp.argmax(logits, axis=-1))[:, : W - 1]
    proposals = np.where(rng.random((B, W - 1)) < 0.7, target, rng.integers(0, V, (B, W - 1)))
    if one_hot:
        q = np.eye(V, dtype=np.float32)[proposals]
    else:
        q = rng.dirichlet(np.full(V, 0.5), size=(B, W - 1)).astype(np.float32)
    lengths = rng.integers(1, W + 1, B)
    return jnp.asarray(q), jnp.asarray(proposals, jnp.int32), jnp.asarray(lengths, jnp.int32)


def _settings(temperature):
    t = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32)[:, None], (B, W))
    return t, jnp.zeros((B, W), jnp.int32), jnp.ones((B, W), jnp.float32)


def _keys(seed: int):
    return jax.random.split(jax.random.key(seed), B), jax.random.split(jax.random.key(seed + 100), B)


@jax.jit
def _full(logits, temperature, top_k, top_p, q, proposals, lengths, accept_key, sample_key):
    """The full path as the programs ran it before the fast path: uniforms from the same keys."""
    p = sampling_probs(logits, temperature, top_k, top_p)
    accept_u = jax.vmap(
        lambda k: jax.vmap(lambda j: jax.random.uniform(jax.random.fold_in(k, j)))(jnp.arange(W - 1))
    )(accept_key)
    sample_u = jax.vmap(jax.random.uniform)(sample_key)
    return accept_proposals(p, q, proposals, lengths, accept_u, sample_u)


_fast = jax.jit(sample_and_accept)


def _assert_same(a, b, lanes=slice(None)):
    for field in ("tokens", "counts", "accepted", "survival"):
        np.testing.assert_array_equal(
            np.asarray(getattr(a, field))[lanes], np.asarray(getattr(b, field))[lanes]
        )


@pytest.mark.parametrize("one_hot", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_all_greedy_acceptance_equals_the_full_path(seed, one_hot):
    logits = _logits(seed)
    q, proposals, lengths = _drafts(seed, logits, one_hot)
    settings = _settings(np.zeros(B))
    keys = _keys(seed)
    fast = _fast(logits, *settings, q, proposals, lengths, *keys)
    _assert_same(fast, _full(logits, *settings, q, proposals, lengths, *keys))
    # and with any other uniforms: greedy acceptance does not depend on them
    accept_u = jax.random.uniform(jax.random.key(seed + 7), (B, W - 1))
    sample_u = jax.random.uniform(jax.random.key(seed + 8), (B,))
    _assert_same(
        fast, accept_proposals(sampling_probs(logits, *settings), q, proposals, lengths, accept_u, sample_u)
    )
    assert int(fast.tokens[0, fast.accepted[0]]) == 3  # lane 0's rows tie 3 and 7: the first argmax


@pytest.mark.parametrize("seed", range(3))
def test_a_mixed_batch_equals_the_full_path(seed):
    logits = _logits(seed)
    q, proposals, lengths = _drafts(seed, logits, one_hot=False)
    settings = _settings([0.0, 0.7, 0.0, 0.0, 1.3, 0.0])
    keys = _keys(seed)
    _assert_same(
        _fast(logits, *settings, q, proposals, lengths, *keys),
        _full(logits, *settings, q, proposals, lengths, *keys),
    )


def test_a_sampled_lane_outside_live_keeps_the_fast_path_for_the_live_lanes():
    logits = _logits(5)
    q, proposals, lengths = _drafts(5, logits, one_hot=True)
    lengths = lengths.at[-1].set(1)  # the last lane just samples from p_0
    greedy, sampled = _settings(np.zeros(B)), _settings([0.0] * (B - 1) + [50.0])
    keys = _keys(6)  # keys whose draw for the sampled lane is not its argmax
    live = jnp.arange(B) < B - 1
    fast = _fast(logits, *sampled, q, proposals, lengths, *keys, live=live)
    _assert_same(fast, _full(logits, *greedy, q, proposals, lengths, *keys), lanes=slice(0, B - 1))
    # The fast path ran: the dead lane got its argmax, where the full path samples another token.
    argmax = int(jnp.argmax(logits[-1, 0]))
    assert int(fast.tokens[-1, 0]) == argmax
    assert int(_full(logits, *sampled, q, proposals, lengths, *keys).tokens[-1, 0]) != argmax
    assert int(_fast(logits, *sampled, q, proposals, lengths, *keys).tokens[-1, 0]) != argmax  # all live


@pytest.mark.parametrize("temperature", [np.zeros(B), np.array([0.0, 0.9, 0.0, 0.0, 0.0, 2.0])])
def test_draw_equals_the_inverse_cdf_draw(temperature):
    logits = _logits(9)[:, 0]
    t = jnp.asarray(temperature, jnp.float32)
    k, p = jnp.array([0, 3, 0, 0, 0, 0], jnp.int32), jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.8], jnp.float32)
    u = jax.random.uniform(jax.random.key(3), (B,))
    tokens, probs = jax.jit(lambda lg: draw(lg, t, k, p, lambda: u))(logits)
    want = sampling_probs(logits, t, k, p)
    np.testing.assert_array_equal(np.asarray(probs), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(sample_inverse_cdf(want, u)))


def _primitives(jaxpr) -> set[str]:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                if hasattr(inner, "jaxpr") and hasattr(inner.jaxpr, "eqns"):
                    names |= _primitives(inner.jaxpr)
    return names


def test_the_greedy_branch_has_no_softmax_and_no_cumulative_sum():
    logits = _logits(0)
    q, proposals, lengths = _drafts(0, logits, one_hot=True)
    jaxpr = jax.make_jaxpr(sample_and_accept)(
        logits, *_settings(np.zeros(B)), q, proposals, lengths, *_keys(0)
    )
    (cond,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    branches = [_primitives(b.jaxpr) for b in cond.params["branches"]]  # (false, true)
    assert {"exp", "cumsum"} <= branches[0]
    assert not {"exp", "cumsum", "random_bits", "threefry2x32"} & branches[1]


def _argmax_cases() -> np.ndarray:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(10, 257)).astype(np.float32)
    x[0] = -np.inf  # every entry -inf: index 0
    x[1, [5, 9]] = np.nan  # the first NaN wins over any number
    x[2] = 1.0  # all tied: the first index
    x[3, [7, 100]] = np.inf  # tied +inf
    x[4] = np.nan  # all NaN
    x[5, [3, 40]] = x[5].max() + 1.0  # a tie at the top
    x[6, -1] = x[6].max() + 1.0  # the last index
    x[7, 0], x[7, 1] = -0.0, 0.0  # -0 == 0: the first of them when they lead
    x[7, 2:] = -1.0
    x[8, 200] = np.nan
    x[8, 3] = np.inf  # NaN beats +inf
    return x


def test_first_argmax_is_argmax():
    x = _argmax_cases()
    want = np.argmax(x, axis=-1)  # numpy: NaN is the largest, ties go to the first index
    np.testing.assert_array_equal(np.asarray(jax.jit(first_argmax)(x)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(jnp.argmax, static_argnums=1)(x, -1)), want)
    x3 = x.reshape(2, 5, 257)
    np.testing.assert_array_equal(np.asarray(jax.jit(first_argmax)(x3)), want.reshape(2, 5))


def test_first_argmax_has_no_pair_reduction():
    """The point of `first_argmax`: no reduction over (value, index) pairs, which XLA's CPU
    compiler runs as a scalar loop (jnp.argmax's lowering, checked here to have one)."""

    def pair_reductions(fn):
        jaxpr = jax.make_jaxpr(fn)(jnp.zeros((4, 257), jnp.float32))
        return [
            e
            for e in jaxpr.jaxpr.eqns
            if e.primitive.name in ("argmax", "reduce") and len(e.outvars) > 1 or e.primitive.name == "argmax"
        ]

    assert pair_reductions(lambda x: jnp.argmax(x, axis=-1))
    assert not pair_reductions(first_argmax)
