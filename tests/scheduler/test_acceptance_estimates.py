"""Acceptance estimates against independent computations (spec, "Completed confidence and
acceptance"): every pooled, cached, batched or tabulated reading of an estimate equals the plain
per-depth formula it stands for, and expected output equals an enumeration over the acceptance
outcomes of a round."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from helios_jax.scheduler.speculation import (
    SOURCE_COPY,
    SOURCE_LEARNED,
    AcceptanceHistory,
    PopulationPrior,
    PrefixEstimate,
    acceptance_observations,
    batch_estimates,
    expected_output,
    expected_output_table,
    initial_prior,
    monotone,
    monotone_expected_output_table,
)

from .helpers import plain_monotone

nan = math.nan
LN20 = math.log(20.0)


class _Replay:
    """The estimator of the spec, one depth at a time in plain Python: weight 2 at the start,
    aged by half every 128 generated tokens, mean moved by (x - mean) / (aged weight + 1)."""

    def __init__(self, prior, tokens=0):
        self.mean = [float(p) for p in prior]
        self.weight = [2.0] * len(self.mean)
        self.share = [1.0] * len(self.mean)
        self.tokens_at = tokens

    def aged(self, tokens):
        return [w * 0.5 ** (max(0, tokens - self.tokens_at) / 128.0) for w in self.weight]

    def observe(self, obs, tokens):
        w = self.aged(tokens)
        for d in range(len(self.mean)):
            x = obs[d] if d < len(obs) else nan
            if not math.isnan(x):
                self.mean[d] += (x - self.mean[d]) / (w[d] + 1.0)
                self.share[d] *= w[d] / (w[d] + 1.0)
                w[d] = min(w[d] + 1.0, 128.0)
        self.weight = w
        self.tokens_at = max(self.tokens_at, tokens)

    def optimistic(self, tokens, mean=None):
        mean = self.mean if mean is None else mean
        bonus = [math.sqrt(LN20 / (2.0 * w)) for w in self.aged(tokens)]
        return plain_monotone([min(1.0, m + b) for m, b in zip(mean, bonus)])


ROUNDS = [  # (observations, generated-token count): NaN unobserved, short rows padded, long cut
    ([1.0, 1.0, 0.0, nan], 3),
    ([0.0, nan, nan, nan], 40),
    ([0.9, 0.4], 200),
    ([1.0, 1.0, 1.0, 1.0, 0.0], 150),  # an earlier count than the last: no aging, no rewind
    ([nan, 0.25, nan, 0.5], 700),
]


def _observed(prior, tokens=0):
    est, ref = PrefixEstimate.from_prior(np.array(prior), tokens), _Replay(prior, tokens)
    for obs, t in ROUNDS:
        est.observe(obs, tokens=t)
        ref.observe(obs, t)
    return est, ref


def test_observations_fold_in_like_a_plain_replay_of_the_update_rule():
    """Means, aged weights (capped at 128), the prior's remaining share and the token count of
    the last aging follow the per-depth update rule; each observation bumps the revision."""
    est, ref = _observed([0.5, 0.25, 0.125, 0.0625], tokens=2)
    assert est.mean.tolist() == pytest.approx(ref.mean, rel=1e-12)
    assert est.weight.tolist() == pytest.approx(ref.weight, rel=1e-12)
    assert est.prior_share.tolist() == pytest.approx(ref.share, rel=1e-12)
    assert est.tokens_at == ref.tokens_at == 700 and est.revision == len(ROUNDS)
    for tokens in (0, 700, 701, 828, 5000):
        assert est.aged_weight(tokens).tolist() == pytest.approx(ref.aged(tokens), rel=1e-12)
    capped, capped_ref = PrefixEstimate.from_prior(np.array([0.5])), _Replay([0.5])
    for _ in range(130):
        capped.observe([1.0], tokens=0)
        capped_ref.observe([1.0], 0)
    assert capped.weight[0] == 128.0 and capped.prior_share[0] == pytest.approx(capped_ref.share[0])


def test_an_estimate_without_an_origin_observes_without_a_prior_share():
    est = PrefixEstimate(np.array([0.6, 0.3]), np.array([4.0, 1.0]), 10)
    est.observe([0.0, 1.0], tokens=10)
    assert est.prior_share is None and est.origin is None
    assert est.mean.tolist() == pytest.approx([0.6 - 0.6 / 5, 0.3 + 0.7 / 2])
    assert est.weight.tolist() == [5.0, 2.0] and est.tokens_at == 10


def test_pooled_means_equal_an_estimate_restarted_from_the_pool():
    """Hierarchical reading (RESOLUTIONS 17): the prior's remaining share moved to the pool's mean
    is the estimate that would have started at the pool's mean and seen the same rounds."""
    est, _ = _observed([0.5, 0.25, 0.125, 0.0625])
    pool_mean = [0.8, 0.3, 0.35, 0.05]  # not monotone: the reading is made monotone afterwards
    twin, twin_ref = _observed(pool_mean)
    pool = PrefixEstimate.from_prior(np.array(pool_mean))
    assert est.means(pool).tolist() == pytest.approx(twin.means().tolist(), rel=1e-12)
    assert est.means(pool).tolist() == pytest.approx(plain_monotone(twin_ref.mean), rel=1e-12)
    for tokens in (700, 760, 900):
        expected = twin_ref.optimistic(tokens)
        assert est.optimistic(tokens, pool).tolist() == pytest.approx(expected, rel=1e-12)
    # The origin itself as the pool changes nothing; an estimate without an origin ignores pools.
    origin = PrefixEstimate.from_prior(np.array([0.5, 0.25, 0.125, 0.0625]))
    assert est.means(origin).tolist() == pytest.approx(est.means().tolist(), rel=1e-12)
    own = PrefixEstimate(np.array([0.7, 0.2, 0.1, 0.0]), np.array([3.0, 3.0, 3.0, 3.0]))
    np.testing.assert_array_equal(own.means(pool), [0.7, 0.2, 0.1, 0.0])
    np.testing.assert_array_equal(own.optimistic(0, pool), own.optimistic(0))


def test_cached_readings_equal_those_of_a_fresh_copy():
    """means(pool) and optimistic(tokens, pool) are cached per (tokens, pool, pool revision):
    whatever was asked before, each answer equals the one of an uncached copy."""
    est, _ = _observed([0.5, 0.25, 0.125, 0.0625])
    pool_a = PrefixEstimate.from_prior(np.array([0.9, 0.6, 0.3, 0.2]))
    pool_b = PrefixEstimate.from_prior(np.array([0.1, 0.05, 0.02, 0.01]))
    asks = [(None, 700), (pool_a, 700), (pool_a, 800), (None, 800), (pool_b, 800), (pool_a, 800)]
    for step, (pool, tokens) in enumerate(asks * 2):
        fresh = est.copy()
        np.testing.assert_array_equal(est.means(pool), fresh.means(pool))
        np.testing.assert_array_equal(est.optimistic(tokens, pool), fresh.optimistic(tokens, pool))
        if step == 5:
            pool_a.observe([0.0, 0.0, 0.0, 0.0], tokens=0)  # the pool moved: a new revision
        if step == 8:
            est.observe([1.0, nan, nan, nan], tokens=800)
    assert not est.means(pool_b).flags.writeable and not est.optimistic(9, pool_b).flags.writeable


def test_copies_read_alike_and_move_apart():
    est, _ = _observed([0.5, 0.25, 0.125, 0.0625])
    pool = PrefixEstimate.from_prior(np.array([0.9, 0.6, 0.3, 0.2]))
    copy = est.copy()
    assert (copy.tokens_at, copy.depth) == (est.tokens_at, 4)
    for name in ("mean", "weight", "origin", "prior_share"):
        np.testing.assert_array_equal(getattr(copy, name), getattr(est, name))
    np.testing.assert_array_equal(copy.optimistic(900, pool), est.optimistic(900, pool))
    before = [getattr(est, n).copy() for n in ("mean", "weight", "origin", "prior_share")]
    copy.observe([0.0, 0.0, 0.0, 0.0], tokens=900)
    copy.origin[0] = 0.0
    for name, old in zip(("mean", "weight", "origin", "prior_share"), before):
        np.testing.assert_array_equal(getattr(est, name), old)
    bare = PrefixEstimate(np.array([0.4]), np.array([3.0]), 5).copy()
    assert bare.origin is None and bare.prior_share is None and bare.tokens_at == 5


def test_estimates_start_from_a_copy_of_the_prior():
    prior = np.array([0.7, 0.2, 0.1])
    est = PrefixEstimate.from_prior(prior, tokens=11)
    prior[:] = 0.0
    assert est.mean.tolist() == [0.7, 0.2, 0.1] and est.origin.tolist() == [0.7, 0.2, 0.1]
    assert est.weight.tolist() == [2.0] * 3 and est.prior_share.tolist() == [1.0] * 3
    assert est.tokens_at == 11 and est.revision == 0
    est.observe([0.0, 0.0, 0.0], tokens=11)
    assert est.origin.tolist() == [0.7, 0.2, 0.1]  # the origin is not the mean that moves
    assert initial_prior(3).tolist() == [0.5, 0.25, 0.125] and initial_prior(0).size == 0


def _batch_cases():
    learned, _ = _observed([0.5, 0.25, 0.125, 0.0625], tokens=1)
    fresh = PrefixEstimate.from_prior(initial_prior(4), tokens=300)
    own = PrefixEstimate(np.array([0.95, 0.9, 0.4, 0.5]), np.array([7.0, 5.0, 1.5, 1.0]), 64)
    odd = PrefixEstimate.from_prior(np.array([0.3, 0.6, 0.2, 0.1]), tokens=5)
    odd.observe([1.0, nan, 0.0, nan], tokens=90)
    return [learned, fresh, own, odd], [900, 100, 64, 500]  # 100: before `fresh` last aged


@pytest.mark.parametrize("with_pool", [False, True])
def test_batched_estimates_equal_each_estimate_read_alone(with_pool):
    """pricing.views reads every resident's estimates at once: row i is estimate i's own
    means(pool) and optimistic(tokens[i], pool), bit for bit, read-only like them."""
    estimates, tokens = _batch_cases()
    pool = PrefixEstimate.from_prior(np.array([0.8, 0.3, 0.35, 0.05])) if with_pool else None
    if pool is not None:
        pool.observe([1.0, 0.0, nan, nan], tokens=0)
    means, upper = batch_estimates(estimates, tokens, pool)
    assert len(means) == len(upper) == len(estimates)
    for est, t, m, u in zip(estimates, tokens, means, upper):
        np.testing.assert_array_equal(m, est.copy().means(pool), strict=True)
        np.testing.assert_array_equal(u, est.copy().optimistic(t, pool), strict=True)
        assert not m.flags.writeable and not u.flags.writeable
    only_means, none = batch_estimates(estimates, tokens, pool, optimistic=False)
    assert none is None
    for m, again in zip(only_means, means):
        np.testing.assert_array_equal(m, again, strict=True)
        assert not m.flags.writeable


def test_batched_estimates_without_origins_ignore_the_pool():
    own = [
        PrefixEstimate(np.array([0.9, 0.95, 0.2]), np.array([3.0, 2.0, 1.0]), 0),
        PrefixEstimate(np.array([0.1, 0.0, 0.0]), np.array([128.0, 64.0, 2.0]), 30),
    ]
    pool = PrefixEstimate.from_prior(np.array([0.5, 0.5, 0.5]))
    means, upper = batch_estimates(own, [10, 20], pool)
    for est, t, m, u in zip(own, [10, 20], means, upper):
        np.testing.assert_array_equal(m, plain_monotone(est.mean))
        bonus = [math.sqrt(LN20 / (2.0 * w)) for w in est.aged_weight(t)]
        assert u.tolist() == pytest.approx(plain_monotone(est.mean + np.array(bonus)), rel=1e-12)


def test_batched_estimates_are_read_in_double_precision_like_each_estimate():
    """A caller may preseed estimates with single-precision or integer means (core.admit's
    acceptance_history): means() reads them as float64, and so does the batched reading."""
    given = [
        PrefixEstimate(np.array([0.9, 0.7, 0.3], dtype=np.float32), np.array([4.0, 3.0, 2.0]), 0),
        PrefixEstimate(np.array([0.1, 0.2, 0.05], dtype=np.float32), np.array([2.0, 2.0, 2.0]), 8),
    ]
    for estimates in (given, [PrefixEstimate(np.array([1, 1, 0]), np.array([8.0, 8.0, 8.0]), 0)]):
        means, upper = batch_estimates(estimates, [16] * len(estimates), None)
        for est, m, u in zip(estimates, means, upper):
            np.testing.assert_array_equal(m, est.means(), strict=True)
            np.testing.assert_array_equal(u, est.optimistic(16), strict=True)


def test_preseeded_estimates_of_any_numeric_dtype_learn_like_double_precision_ones():
    """An estimate preseeded with integer or float32 means, weights and shares (core.admit's
    acceptance_history) observes rounds like the same estimate given in float64: observe()
    updates them in place, which an integer array could not hold."""
    rounds = [[1.0, 0.0, nan], [0.0, nan, nan], [1.0, 1.0, 1.0]]
    for dtype in (np.int64, np.float32):
        given = PrefixEstimate(
            np.array([1, 1, 0], dtype=dtype),
            np.array([2, 3, 4], dtype=dtype),
            5,
            origin=np.array([1.0, 1.0, 0.0]),
            prior_share=np.array([1, 1, 1], dtype=dtype),
        )
        double = PrefixEstimate(
            np.array([1.0, 1.0, 0.0]),
            np.array([2.0, 3.0, 4.0]),
            5,
            origin=np.array([1.0, 1.0, 0.0]),
            prior_share=np.ones(3),
        )
        for i, row in enumerate(rounds):
            given.observe(row, tokens=5 + 40 * i)
            double.observe(row, tokens=5 + 40 * i)
        for a, b in ((given.mean, double.mean), (given.weight, double.weight)):
            np.testing.assert_array_equal(a, b, strict=True)
        np.testing.assert_array_equal(given.prior_share, double.prior_share, strict=True)
        np.testing.assert_array_equal(given.optimistic(200), double.optimistic(200), strict=True)


def _enumerated_output(survival, width):
    """E[committed tokens] of a round of `width` rows by enumerating which of its proposals
    verification accepts: proposal d survives given the ones before with s_d / s_{d-1}; the round
    commits the pending token plus its leading accepted proposals."""
    if width <= 0:
        return 0.0
    s = plain_monotone(survival)
    offered = min(width - 1, len(s))
    cond = [s[d] / (s[d - 1] if d else 1.0) if (s[d - 1] if d else 1.0) > 0 else 0.0 for d in range(offered)]
    total = 0.0
    for outcome in itertools.product((True, False), repeat=offered):
        prob, leading = 1.0, 0
        for d, accepted in enumerate(outcome):
            prob *= cond[d] if accepted else 1.0 - cond[d]
            leading += accepted and leading == d
        total += prob * (1 + leading)
    return total


LANES = [
    [0.9, 0.72, 0.36, 0.18, 0.09],
    [1.0, 1.0, 0.5, 0.0, 0.0],
    [0.4, 0.6, 0.2, 0.3, 1.2],  # not monotone, out of range: made monotone and clipped first
    [0.0, 0.0, 0.0, 0.0, 0.0],
    [-0.2, 0.5, 0.5, 0.5, 0.5],
]


@pytest.mark.parametrize("lane", LANES)
def test_expected_output_is_the_mean_over_acceptance_outcomes(lane):
    for width in range(-1, len(lane) + 4):
        assert expected_output(np.array(lane), width) == pytest.approx(_enumerated_output(lane, width))


@pytest.mark.parametrize("alpha", [0.5, 2.0, 3.0])
def test_alpha_prices_each_survival_term_to_its_power(alpha):
    """alpha (adaptive_verification_alpha) applies to the survival terms: the outcomes are
    enumerated with prefix survival s_d ** alpha."""
    for lane in LANES:
        powered = [v**alpha for v in plain_monotone(lane)]
        for width in range(0, len(lane) + 3):
            assert expected_output(np.array(lane), width, alpha) == pytest.approx(
                _enumerated_output(powered, width)
            )


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("depth", [0, 1, 3, 5])
def test_output_tables_equal_one_lane_at_a_time(alpha, depth):
    """Row n, column w of the lane table is expected_output(lane n, w), for widths below, at and
    beyond the depth (where wider rounds add nothing)."""
    lanes = np.array([lane[:depth] for lane in LANES]).reshape(len(LANES), depth)
    for max_width in range(0, depth + 4):
        table = expected_output_table(lanes, max_width, alpha)
        ready = monotone_expected_output_table(monotone(lanes), max_width, alpha)
        assert table.shape == ready.shape == (len(LANES), max_width + 1)
        for n, lane in enumerate(lanes):
            want = [expected_output(lane, w, alpha) for w in range(max_width + 1)]
            assert table[n].tolist() == pytest.approx(want, rel=1e-12)
            assert ready[n].tolist() == pytest.approx(want, rel=1e-12)


def test_monotone_is_a_clipped_running_minimum_per_row():
    rows = np.array([[0.3, 0.5, 0.1, 0.2], [1.4, 1.1, 0.8, 0.9], [-0.5, 0.4, 0.3, 0.0]])
    for row, got in zip(rows, monotone(rows)):
        assert got.tolist() == plain_monotone(row)
    assert monotone(rows[1]).tolist() == plain_monotone(rows[1])
    assert rows[1, 0] == 1.4  # the input is not clipped in place


def _plain_observations(depth, offered, accepted, terminated_after, survival):
    out = []
    for d in range(1, depth + 1):
        if d > offered or (terminated_after is not None and d > terminated_after):
            out.append(nan)
        elif survival is not None and d <= len(survival):
            out.append(survival[d - 1])
        else:
            out.append(1.0 if d <= accepted else 0.0)
    return out


def test_round_observations_follow_the_per_depth_rule_exhaustively():
    """Depth d of a round offering k proposals, a accepted: 1 for d <= a, 0 for a < d <= k,
    unobserved beyond k, beyond the estimate's depth and beyond termination; survival values
    replace the observed depths they cover."""
    for depth, offered in itertools.product(range(5), range(6)):
        for accepted, end in itertools.product(range(offered + 1), [None, -1, 0, 1, 2, 3, 6]):
            for surv in (None, [0.9], [0.8, 0.6, 0.3], [0.7, 0.5, 0.4, 0.2, 0.1, 0.05]):
                got = acceptance_observations(depth, offered, accepted, terminated_after=end, survival=surv)
                want = _plain_observations(depth, offered, accepted, end, surv)
                np.testing.assert_array_equal(got, want, strict=True)
    for offered, accepted in ((2, 3), (2, -1), (0, 1)):
        with pytest.raises(ValueError):
            acceptance_observations(4, offered, accepted)


def test_the_population_prior_moves_one_sixty_fourth_per_observed_depth():
    prior, plain = PopulationPrior(4), [0.5, 0.25, 0.125, 0.0625]
    assert prior.depth == 4
    for obs in ([1.0, 0.0, nan, nan], [0.3], [1.0, 1.0, 1.0, 1.0, 1.0], [nan, nan, 0.5, 0.0]):
        prior.observe(np.array(obs))
        for d, x in enumerate(obs[:4]):
            plain[d] += 0 if math.isnan(x) else (x - plain[d]) / 64.0
        assert prior.mean.tolist() == pytest.approx(plain, rel=1e-12)
    copy = prior.copy()
    assert copy.depth == 4 and copy.mean.tolist() == prior.mean.tolist()
    copy.observe(np.array([0.0, 0.0, 0.0, 0.0]))
    assert prior.mean.tolist() == pytest.approx(plain, rel=1e-12)


def test_histories_start_from_the_priors_and_copy_preseeded_estimates():
    priors = {SOURCE_LEARNED: PopulationPrior(3), SOURCE_COPY: PopulationPrior(3)}
    priors[SOURCE_COPY].observe(np.array([1.0, 1.0, 1.0]))
    seeded = PrefixEstimate(np.array([0.9, 0.8, 0.7]), np.array([5.0, 5.0, 5.0]), 40)
    hist = AcceptanceHistory(priors, tokens=40, preseeded={SOURCE_LEARNED: seeded})
    seeded.observe([0.0, 0.0, 0.0], tokens=40)
    learned, copy = hist.get(SOURCE_LEARNED), hist.get(SOURCE_COPY)
    assert learned.mean.tolist() == [0.9, 0.8, 0.7] and learned is not seeded
    assert learned.weight.tolist() == [5.0] * 3 and learned.tokens_at == 40
    np.testing.assert_array_equal(copy.mean, priors[SOURCE_COPY].mean)
    np.testing.assert_array_equal(copy.origin, priors[SOURCE_COPY].mean)
    assert copy.tokens_at == 40 and copy.weight.tolist() == [2.0] * 3
    priors[SOURCE_COPY].observe(np.array([0.0, 0.0, 0.0]))
    assert copy.mean[0] > priors[SOURCE_COPY].mean[0]  # the estimate holds its own copy
    with pytest.raises(ValueError, match="unknown proposal source"):
        AcceptanceHistory(priors, preseeded={"oracle": seeded})
    twin = hist.copy()
    twin.get(SOURCE_COPY).observe([0.0, 0.0, 0.0], tokens=40)
    assert set(twin.estimates) == set(hist.estimates) and hist.get(SOURCE_COPY).revision == 0
    assert twin.get(SOURCE_LEARNED).mean.tolist() == [0.9, 0.8, 0.7]
