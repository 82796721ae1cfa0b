"""Greedy and rejection-sampling acceptance, vectorised, against the numpy oracle.

- Distribution: 100,000 seeded lanes over a 5-token vocabulary, W = 3 (two proposals drawn from
  q, target rows p_0..p_2 fixed), must emit first tokens distributed as p_0 and (first, second)
  pairs distributed as p_0 x p_1: a chi-square goodness-of-fit test must not reject at
  p < 1e-3. The oracle (reference/sampling.py), run on its own RNG, must pass the same test,
  and the two histograms must agree with each other (two-sample chi-square).
- Draw for draw: with shared uniforms the jax rule and the oracle emit the same tokens and the
  same survival products.
- Worked example of acceptance.py, greedy as one-hot p and q, sampling distributions against the
  naive oracle.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helios_jax.programs.acceptance import accept_proposals
from helios_jax.programs.sampling import sample_inverse_cdf, sampling_probs
from helios_jax.reference.sampling import accept_naive, draw_inverse_cdf, sampling_probs_naive

spec = pytest.mark.spec
V, W, DRAWS = 5, 3, 100_000
P_VALUE = 1e-3

accept = jax.jit(accept_proposals)


def chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularised upper incomplete gamma."""
    return float(jax.scipy.special.gammaincc(dof / 2.0, statistic / 2.0))


def goodness_of_fit(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a zero-probability outcome was drawn"
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    return chi_square_sf(stat, int(keep.sum()) - 1)


def two_sample(a: np.ndarray, b: np.ndarray) -> float:
    keep = (a + b) > 0
    a, b = a[keep].astype(float), b[keep].astype(float)
    ka, kb = np.sqrt(b.sum() / a.sum()), np.sqrt(a.sum() / b.sum())
    stat = float((((ka * a - kb * b) ** 2) / (a + b)).sum())
    return chi_square_sf(stat, keep.sum() - 1)


def _problem(seed: int):
    """Fixed p_0..p_2 and q_0..q_1 with disjoint-ish supports so every branch is exercised."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.7), size=W)
    q = rng.dirichlet(np.full(V, 0.7), size=W - 1)
    p[0, 4] = 0.0  # a token the target never emits but the draft may propose
    p[0] /= p[0].sum()
    return p.astype(np.float32), q.astype(np.float32)


def _jax_draws(p, q, seed: int, length: int = W):
    key_q, key_u = jax.random.split(jax.random.key(seed))
    # Proposal j drawn from q_j (inverse CDF with its own uniforms).
    proposals = sample_inverse_cdf(
        jnp.broadcast_to(q, (DRAWS, W - 1, V)), jax.random.uniform(key_q, (DRAWS, W - 1))
    )
    u = jax.random.uniform(key_u, (DRAWS, W))
    out = accept(
        jnp.broadcast_to(p, (DRAWS, W, V)),
        jnp.broadcast_to(q, (DRAWS, W - 1, V)),
        proposals,
        jnp.full((DRAWS,), length, jnp.int32),
        u[:, : W - 1],
        u[:, W - 1],
    )
    return np.asarray(out.tokens), np.asarray(out.counts)


def _histograms(tokens, counts):
    first = np.bincount(tokens[:, 0], minlength=V)
    two = counts >= 2
    pairs = np.bincount(tokens[two, 0] * V + tokens[two, 1], minlength=V * V)
    return first, pairs, two


@spec("useful-service/output-progress")
def test_rejection_sampling_preserves_the_target_distribution():
    p, q = _problem(seed=1)
    tokens, counts = _jax_draws(p, q, seed=2)
    assert counts.min() >= 1 and counts.max() <= W
    first, pairs, two = _histograms(tokens, counts)
    assert goodness_of_fit(first, p[0].astype(np.float64)) > P_VALUE
    # A second token is emitted iff proposal 0 was accepted; it then follows p_1 exactly, and
    # the pair follows the law of `_pair_law`.
    second = np.bincount(tokens[two, 1], minlength=V)
    assert goodness_of_fit(second, p[1].astype(np.float64)) > P_VALUE
    assert goodness_of_fit(pairs, _pair_law(p, q)) > P_VALUE


def _pair_law(p, q):
    """The exact law of (token 0, token 1) among lanes that emitted >= 2 tokens.

    A lane emits a second token iff proposal 0 was accepted; given acceptance, token 0 = d_0 has
    probability min(q_0, p_0) / sum(min(q_0, p_0)), and token 1 then follows p_1 exactly."""
    accepted_first = np.minimum(q[0].astype(np.float64), p[0].astype(np.float64))
    law = np.outer(accepted_first / accepted_first.sum(), p[1].astype(np.float64))
    return law.reshape(-1)


@spec("useful-service/output-progress")
def test_numpy_oracle_preserves_the_target_distribution_and_matches_jax():
    p, q = _problem(seed=1)
    rng = np.random.default_rng(3)
    n = DRAWS // 4  # the oracle loops in Python
    tokens = np.zeros((n, W), np.int64)
    counts = np.zeros((n,), np.int64)
    for i in range(n):
        props = [draw_inverse_cdf(q[j], rng.random()) for j in range(W - 1)]
        out, _ = accept_naive(p, q, props, W, rng=rng)
        tokens[i, : len(out)] = out
        counts[i] = len(out)
    first, pairs, two = _histograms(tokens, counts)
    assert goodness_of_fit(first, p[0].astype(np.float64)) > P_VALUE
    assert goodness_of_fit(pairs, _pair_law(p, q)) > P_VALUE
    jax_tokens, jax_counts = _jax_draws(p, q, seed=4)
    jax_first, jax_pairs, _ = _histograms(jax_tokens, jax_counts)
    assert two_sample(first, jax_first) > P_VALUE
    assert two_sample(pairs, jax_pairs) > P_VALUE
    assert (
        two_sample(np.bincount(counts, minlength=W + 1), np.bincount(jax_counts, minlength=W + 1)) > P_VALUE
    )


@spec("confidence-acceptance/survival-output")
@pytest.mark.parametrize("length", [1, 2, 3])
def test_shared_uniforms_give_the_oracle_draws_exactly(length):
    """Draw for draw with shared uniforms (float64 oracle vs float32 jax; a draw that lands
    within float32 rounding of a CDF boundary could differ, so such cases are counted, not
    forbidden: at most 0.1%)."""
    rng = np.random.default_rng(10 + length)
    n = 2000
    p = rng.dirichlet(np.full(V, 0.5), size=(n, W)).astype(np.float32)
    q = rng.dirichlet(np.full(V, 0.5), size=(n, W - 1)).astype(np.float32)
    props = np.array([[draw_inverse_cdf(q[i, j], rng.random()) for j in range(W - 1)] for i in range(n)])
    u = rng.random((n, W)).astype(np.float32)
    out = accept(
        jnp.asarray(p),
        jnp.asarray(q),
        jnp.asarray(props, jnp.int32),
        jnp.full((n,), length, jnp.int32),
        jnp.asarray(u[:, : W - 1]),
        jnp.asarray(u[:, W - 1]),
    )
    tokens, counts, survival = map(np.asarray, (out.tokens, out.counts, out.survival))
    mismatches = 0
    for i in range(n):
        want, want_survival = accept_naive(p[i], q[i], props[i], length, uniforms=u[i].astype(np.float64))
        got = tokens[i, : counts[i]].tolist()
        mismatches += got != want
        np.testing.assert_allclose(survival[i, : length - 1], want_survival, rtol=1e-5)
        assert np.all(survival[i, length - 1 :] == 0)
    assert mismatches <= n // 1000


@spec("confidence-acceptance/survival-output")
def test_worked_example_of_the_module_docstring():
    q = np.array([[[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]]], np.float32)
    p = np.array([[[0.2, 0.3, 0.5], [0.6, 0.2, 0.2], [1 / 3, 1 / 3, 1 / 3]]], np.float32)
    out = accept(
        jnp.asarray(p),
        jnp.asarray(q),
        jnp.asarray([[1, 2]], jnp.int32),
        jnp.asarray([3], jnp.int32),
        jnp.asarray([[0.4, 0.9]], jnp.float32),
        jnp.asarray([0.9], jnp.float32),
    )
    # residual [5/6, 1/6, 0]: u = 0.9 lands on token 1.
    assert np.asarray(out.tokens).tolist() == [[1, 1, 0]]
    assert int(out.counts[0]) == 2 and int(out.accepted[0]) == 1
    np.testing.assert_allclose(np.asarray(out.survival), [[0.6, 0.15]], rtol=1e-6)


def test_greedy_is_one_hot_acceptance():
    """Temperature 0: accept while the proposal is the target argmax, then emit the argmax;
    survival is 1 up to the first mismatch and 0 from it."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((1, 4, 7)).astype(np.float32)
    greedy = np.argmax(logits[0], axis=-1)
    zeros = jnp.zeros((1, 4), jnp.float32)
    p = sampling_probs(jnp.asarray(logits), zeros, jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4)))
    proposals = np.array([[greedy[0], greedy[1], (greedy[2] + 1) % 7]], np.int32)
    q = jax.nn.one_hot(proposals, 7)
    out = accept(
        p, q, jnp.asarray(proposals), jnp.asarray([4]), jnp.full((1, 3), 0.999), jnp.asarray([0.999])
    )
    assert np.asarray(out.tokens)[0, :3].tolist() == [greedy[0], greedy[1], greedy[2]]
    assert int(out.counts[0]) == 3
    assert np.asarray(out.survival).tolist() == [[1.0, 1.0, 0.0]]


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [
        (0.0, 0, 1.0),
        (1.0, 0, 1.0),
        (0.7, 0, 1.0),
        (1.3, 3, 1.0),
        (1.0, 0, 0.6),
        (0.8, 4, 0.9),
        (1.0, 1, 1.0),
    ],
)
def test_sampling_distribution_matches_the_naive_oracle(temperature, top_k, top_p):
    rng = np.random.default_rng(int(temperature * 10) + top_k)
    logits = (2 * rng.standard_normal((6, 11))).astype(np.float32)
    logits[0, :4] = logits[0, 0]  # ties
    n = logits.shape[0]
    got = np.asarray(
        sampling_probs(
            jnp.asarray(logits),
            jnp.full((n,), temperature),
            jnp.full((n,), top_k, jnp.int32),
            jnp.full((n,), top_p),
        )
    )
    for i in range(n):
        np.testing.assert_allclose(
            got[i], sampling_probs_naive(logits[i], temperature, top_k, top_p), atol=2e-6
        )
    draws = np.asarray(sample_inverse_cdf(jnp.asarray(got), jnp.linspace(0, 0.999, n)))
    assert all(got[i, draws[i]] > 0 for i in range(n))


def test_sampling_rows_with_different_settings_match_the_oracle_row_by_row():
    """A batch mixing greedy, plain sampling and truncated rows: truncation (the sorts) runs for
    the whole batch when any sampled row truncates, and leaves the other rows unchanged."""
    rng = np.random.default_rng(11)
    logits = (2 * rng.standard_normal((5, 13))).astype(np.float32)
    settings = [(0.0, 5, 0.5), (1.0, 0, 1.0), (0.8, 3, 1.0), (1.2, 0, 0.7), (0.9, 0, 1.0)]
    for rows in (settings, [s for s in settings if s[0] == 0 or (s[1] == 0 and s[2] == 1.0)]):
        t, k, p = (np.array(c) for c in zip(*rows))
        got = np.asarray(
            sampling_probs(
                jnp.asarray(logits[: len(rows)]),
                jnp.asarray(t, jnp.float32),
                jnp.asarray(k, jnp.int32),
                jnp.asarray(p, jnp.float32),
            )
        )
        for i, (ti, ki, pi) in enumerate(rows):
            np.testing.assert_allclose(got[i], sampling_probs_naive(logits[i], ti, ki, pi), atol=2e-6)
