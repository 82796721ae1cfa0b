"""The coupled (Gumbel-max) acceptance rule of seeded requests, vectorised, on fixed p and q.

Setting of test_acceptance.py: V = 5, W = 3, fixed target rows p_0..p_2 and draft rows q_0, q_1,
100,000 lanes. Each lane has its own Gumbel noise per row (in the programs: keyed by the seed and
the row's absolute position); proposals are the Gumbel-max draws from q with the same noise.

- Exactness: emitted first tokens are distributed as p_0 and (first, second) pairs as p_0 x p_1
  (chi-square goodness of fit, p >= 1e-3).
- Drafter invariance: with the same noise, proposals drawn from another draft distribution, or
  arbitrary supplied tokens, change how many are accepted but never an emitted token: every lane
  emits exactly the keyed draws argmax(log p_j + G_j) up to its count.
- Acceptance: the first proposal's acceptance rate lies between the coupling's guarantee
  (1 - TV) / (1 + TV) and rejection sampling's 1 - TV (Daliri et al. 2024).
"""

import jax
import jax.numpy as jnp
import numpy as np

from helios_jax.programs.acceptance import accept_coupled
from helios_jax.programs.sampling import gumbel_max

from .test_acceptance import P_VALUE, V, W, _problem, goodness_of_fit

LANES = 100_000

coupled = jax.jit(accept_coupled)


def _noise(seed: int) -> jax.Array:
    return jax.random.gumbel(jax.random.key(seed), (LANES, W, V), jnp.float32)


def _run(p, q, noise, proposals=None):
    if proposals is None:  # drawn from q with the same noise as the target rows they face
        proposals = gumbel_max(jnp.broadcast_to(q, (LANES, W - 1, V)), noise[:, : W - 1])
    out = coupled(
        jnp.broadcast_to(p, (LANES, W, V)),
        noise,
        jnp.broadcast_to(q, (LANES, W - 1, V)),
        proposals,
        jnp.full((LANES,), W, jnp.int32),
    )
    return np.asarray(out.tokens), np.asarray(out.counts), np.asarray(proposals)


def test_coupled_acceptance_emits_the_target_distribution():
    p, q = _problem(3)
    tokens, counts, _ = _run(p, q, _noise(0))
    assert goodness_of_fit(np.bincount(tokens[:, 0], minlength=V), p[0].astype(np.float64)) > P_VALUE
    second = counts >= 2  # rows past the first emit only after an accepted proposal
    pairs = np.bincount(tokens[second, 0] * V + tokens[second, 1], minlength=V * V).reshape(V, V)
    for first in range(V):  # given the first token, the second is distributed as p_1
        if pairs[first].sum() >= 200:
            assert goodness_of_fit(pairs[first], p[1].astype(np.float64)) > P_VALUE


def test_emitted_tokens_do_not_depend_on_the_drafter():
    p, q = _problem(3)
    other = np.roll(q, 2, axis=-1)  # a different draft distribution, same support size
    noise = _noise(1)
    keyed = np.asarray(gumbel_max(jnp.broadcast_to(p, (LANES, W, V)), noise))  # the target's draws
    supplied = np.asarray(jax.random.randint(jax.random.key(2), (LANES, W - 1), 0, V))
    runs = [_run(p, q, noise), _run(p, other, noise), _run(p, q, noise, jnp.asarray(supplied))]
    column = np.arange(W)[None, :]
    for tokens, counts, proposals in runs:
        inside = column < counts[:, None]
        assert np.array_equal(np.where(inside, tokens, -1), np.where(inside, keyed, -1))
        # accepted while the proposal equals the keyed draw, and only then
        matches = np.cumprod(proposals == keyed[:, : W - 1], axis=1).sum(axis=1)
        assert np.array_equal(counts, matches + 1)
    assert not np.array_equal(runs[0][1], runs[1][1])  # the drafters differ in acceptance only


def test_first_acceptance_lies_between_the_coupling_bound_and_rejection_sampling():
    p, q = _problem(3)
    _, counts, _ = _run(p, q, _noise(4))
    tv = 0.5 * float(np.abs(p[0] - q[0]).sum())
    rate = float(np.mean(counts >= 2))
    margin = 4 * np.sqrt(0.25 / LANES)
    assert (1 - tv) / (1 + tv) - margin <= rate <= 1 - tv + margin
