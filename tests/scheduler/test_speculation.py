"""Acceptance and forecast estimators, observations and expected output."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helios_jax.scheduler.rounds import forecast_observations
from helios_jax.scheduler.speculation import (
    SOURCE_COPY,
    SOURCE_LEARNED,
    AcceptanceHistory,
    PopulationPrior,
    PrefixEstimate,
    acceptance_observations,
    expected_output,
    expected_output_table,
    initial_prior,
)

spec = pytest.mark.spec
nan = math.nan


@spec("confidence-acceptance/prior-init", "confidence-acceptance/initial-weight")
def test_estimates_start_at_half_powers_with_weight_two():
    est = PrefixEstimate.from_prior(initial_prior(4))
    np.testing.assert_allclose(est.mean, [0.5, 0.25, 0.125, 0.0625])
    np.testing.assert_allclose(est.weight, [2, 2, 2, 2])


@spec("confidence-acceptance/prior-update")
def test_population_prior_moves_one_sixty_fourth():
    prior = PopulationPrior(3)
    prior.observe(np.array([1.0, 0.0, nan]))
    np.testing.assert_allclose(prior.mean, [0.5 + 0.5 / 64, 0.25 - 0.25 / 64, 0.125])


@spec("confidence-acceptance/forecast-average", "confidence-acceptance/unobserved-retain")
def test_observation_is_a_weighted_average():
    """Weight 2 at mean 0.5; observing 1.0 gives (2*0.5 + 1)/3 = 2/3 and weight 3."""
    est = PrefixEstimate.from_prior(initial_prior(2))
    est.observe([1.0, nan], tokens=0)
    assert est.mean[0] == pytest.approx(2 / 3) and est.weight[0] == 3
    assert est.mean[1] == 0.25 and est.weight[1] == 2  # unobserved depth keeps its mean


@spec("confidence-acceptance/weight-cap")
def test_weight_caps_at_128():
    est = PrefixEstimate.from_prior(initial_prior(1))
    for _ in range(300):
        est.observe([1.0], tokens=0)
    assert est.weight[0] == 128


@spec("confidence-acceptance/half-life")
def test_weights_halve_every_128_generated_tokens():
    est = PrefixEstimate.from_prior(initial_prior(1))
    assert est.aged_weight(128)[0] == pytest.approx(1.0)
    assert est.aged_weight(256)[0] == pytest.approx(0.5)
    assert est.aged_weight(64)[0] == pytest.approx(2 * 0.5**0.5)
    est.observe([1.0], tokens=128)  # aged weight 1: mean (1*0.5 + 1)/2
    assert est.mean[0] == pytest.approx(0.75) and est.weight[0] == pytest.approx(2.0)
    # Aging restarts from the observation: 128 tokens later the weight 2 has halved once, not twice.
    assert est.aged_weight(256)[0] == pytest.approx(1.0)
    est.observe([0.0], tokens=256)  # aged weight 1 again: mean (1*0.75 + 0)/2
    assert est.mean[0] == pytest.approx(0.375) and est.weight[0] == pytest.approx(2.0)


@spec("confidence-acceptance/half-life", "confidence-acceptance/optimistic-estimate")
def test_the_optimistic_bonus_grows_as_the_weight_ages():
    """Mean 0.02, weight 2. The bonus sqrt(ln 20 / (2 * aged weight)) is 0.865409 at token 0,
    0.943735 after 32 tokens (weight 2 * 0.5**0.25) and 1.223873 after 128 (weight 1): capped."""
    est = PrefixEstimate.from_prior(np.array([0.02]))
    for _ in range(2):  # the cached estimate follows the token count asked for
        assert est.optimistic(0)[0] == pytest.approx(0.02 + 0.865409, rel=1e-6)
        assert est.optimistic(32)[0] == pytest.approx(0.02 + 0.943735, rel=1e-6)
        assert est.optimistic(128)[0] == 1.0


@spec("confidence-acceptance/optimistic-estimate", "confidence-acceptance/ordinary-means")
def test_optimistic_bound():
    est = PrefixEstimate.from_prior(np.array([0.3, 0.2]))
    bonus = math.sqrt(math.log(20) / (2 * 2))
    np.testing.assert_allclose(est.optimistic(0), [min(1, 0.3 + bonus), min(1, 0.2 + bonus)])
    np.testing.assert_allclose(est.means(), [0.3, 0.2])
    assert est.optimistic(10_000)[0] == 1.0  # fully aged weight: no information, capped at one


@spec(
    "confidence-acceptance/accepted-positive",
    "confidence-acceptance/rejection-zero",
    "confidence-acceptance/termination-censors",
)
def test_round_observations():
    np.testing.assert_array_equal(acceptance_observations(5, offered=4, accepted=2), [1, 1, 0, 0, nan])
    np.testing.assert_array_equal(acceptance_observations(5, offered=4, accepted=4), [1, 1, 1, 1, nan])
    np.testing.assert_array_equal(
        acceptance_observations(5, offered=4, accepted=3, terminated_after=1), [1, nan, nan, nan, nan]
    )
    with pytest.raises(ValueError):
        acceptance_observations(5, offered=2, accepted=3)


@spec("confidence-acceptance/width-one-no-acceptance")
def test_width_one_rounds_observe_nothing():
    assert np.isnan(acceptance_observations(4, offered=0, accepted=0)).all()


@spec("confidence-acceptance/survival-replaces")
def test_survival_rows_replace_binary_observations():
    obs = acceptance_observations(4, offered=3, accepted=1, survival=[0.9, 0.4])
    np.testing.assert_allclose(obs, [0.9, 0.4, 0.0, nan])
    with pytest.raises(ValueError):
        acceptance_observations(4, offered=3, accepted=1, survival=[1.5])


@spec("confidence-acceptance/per-source", "confidence-acceptance/separate-observations")
def test_acceptance_is_tracked_per_source():
    priors = {SOURCE_LEARNED: PopulationPrior(2), SOURCE_COPY: PopulationPrior(2)}
    hist = AcceptanceHistory(priors)
    hist.get(SOURCE_COPY).observe([1.0, 1.0], tokens=0)
    np.testing.assert_allclose(hist.get(SOURCE_LEARNED).mean, [0.5, 0.25])
    assert hist.get(SOURCE_COPY).mean[0] > 0.5
    with pytest.raises(ValueError):
        hist.get("oracle")


@spec("confidence-acceptance/expected-output", "confidence-acceptance/alpha-exponent")
def test_expected_output():
    s = np.array([0.8, 0.5, 0.2])
    assert expected_output(s, 1) == 1.0
    assert expected_output(s, 3) == pytest.approx(1 + 0.8 + 0.5)
    assert expected_output(s, 4, alpha=2.0) == pytest.approx(1 + 0.64 + 0.25 + 0.04)
    table = expected_output_table(s[None, :], 6)
    np.testing.assert_allclose(table[0], [0, 1, 1.8, 2.3, 2.5, 2.5, 2.5])
    # alpha applies to every survival term of the table the selector prices lanes with
    squared = expected_output_table(s[None, :], 5, alpha=2.0)
    np.testing.assert_allclose(squared[0], [0, 1, 1.64, 1.89, 1.93, 1.93])
    np.testing.assert_allclose(
        expected_output_table(s[None, :], 4, alpha=0.5)[0],
        [0, 1, 1 + 0.8**0.5, 1 + 0.8**0.5 + 0.5**0.5, 1 + 0.8**0.5 + 0.5**0.5 + 0.2**0.5],
    )


@spec("acceptance-learning/forecast-ceiling")
def test_forecast_observations_stop_at_the_ceiling():
    obs = forecast_observations([0.9, 0.7, 0.4, 0.1], ceiling=3, depth=5)
    np.testing.assert_allclose(obs[:2], [0.9, 0.7])
    assert np.isnan(obs[2:]).all()
    with pytest.raises(ValueError, match="valid probabilities"):
        forecast_observations([1.2], ceiling=2, depth=2)


@spec("confidence-acceptance/peer-valid-probs")
def test_forecast_values_must_be_probabilities():
    with pytest.raises(ValueError):
        forecast_observations([math.nan], ceiling=2, depth=1)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=60), st.integers(0, 2000))
def test_estimates_stay_probabilities_and_bounded_weights(xs, tokens):
    est = PrefixEstimate.from_prior(initial_prior(1))
    for i, x in enumerate(xs):
        est.observe([x], tokens=tokens + i)
        assert 0.0 <= est.mean[0] <= 1.0
        assert 0.0 < est.weight[0] <= 128
    assert min(xs + [0.5]) - 1e-12 <= est.mean[0] <= max(xs + [0.5]) + 1e-12
    assert (est.optimistic(tokens) >= est.means() - 1e-12).all()


@spec("confidence-acceptance/expected-output")
def test_expected_output_of_no_rows_is_nothing():
    s = np.array([0.8, 0.5])
    assert expected_output(s, 0) == 0.0 and expected_output(s, -1) == 0.0
    np.testing.assert_array_equal(expected_output_table(s[None, :], 0), [[0.0]])
    np.testing.assert_allclose(expected_output_table(s[None, :], 1), [[0.0, 1.0]])
    np.testing.assert_allclose(expected_output_table(s[None, :], 2), [[0.0, 1.0, 1.8]])
    np.testing.assert_allclose(expected_output_table(s[None, :2], 4), [[0.0, 1.0, 1.8, 2.3, 2.3]])


def test_copies_are_independent():
    prior = PopulationPrior(2)
    prior_copy = prior.copy()
    prior_copy.observe(np.array([1.0, 1.0]))
    np.testing.assert_allclose(prior.mean, [0.5, 0.25])
    assert prior_copy.depth == 2 and prior_copy.mean[0] > 0.5
    hist = AcceptanceHistory({SOURCE_LEARNED: prior, SOURCE_COPY: prior})
    hist_copy = hist.copy()
    hist_copy.get(SOURCE_LEARNED).observe([1.0, 1.0], tokens=0)
    np.testing.assert_allclose(hist.get(SOURCE_LEARNED).mean, [0.5, 0.25])
    assert set(hist_copy.estimates) == {SOURCE_LEARNED, SOURCE_COPY}
    assert hist_copy.get(SOURCE_LEARNED).mean[0] > 0.5


@spec(
    "confidence-acceptance/termination-censors",
    "confidence-acceptance/survival-replaces",
    "confidence-acceptance/peer-valid-probs",
)
def test_censoring_and_survival_rows_at_their_edges():
    # Ending before any of the round's accepted proposals censors every depth.
    assert np.isnan(acceptance_observations(4, offered=3, accepted=2, terminated_after=0)).all()
    # Survival values replace observations only where the round still observes: censored depths stay NaN.
    obs = acceptance_observations(4, offered=3, accepted=3, terminated_after=1, survival=[0.9, 0.4, 0.2])
    np.testing.assert_array_equal(obs, [0.9, nan, nan, nan])
    # Probabilities include both ends; anything else is an error.
    np.testing.assert_array_equal(
        acceptance_observations(3, offered=2, accepted=1, survival=[1.0, 0.0]), [1.0, 0.0, nan]
    )
    for bad in ([nan], [math.inf], [-0.1], [1.1]):
        with pytest.raises(ValueError):
            acceptance_observations(3, offered=2, accepted=1, survival=bad)


@spec("confidence-acceptance/half-life")
def test_a_copied_estimate_ages_from_the_same_token_count():
    est = PrefixEstimate.from_prior(initial_prior(2), tokens=100)
    est.observe([1.0, 0.0], tokens=228)
    copy = est.copy()
    np.testing.assert_array_equal(copy.aged_weight(356), est.aged_weight(356))
    assert copy.tokens_at == 228


@spec("confidence-acceptance/expected-output", "confidence-acceptance/alpha-exponent")
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_one_lane_and_the_table_agree_exactly_whatever_the_input_precision(alpha):
    s = np.array([0.9, 0.7, 0.3, 0.1], dtype=np.float32)
    table = expected_output_table(s[None, :], 6, alpha)
    assert [expected_output(s, w, alpha) for w in range(7)] == table[0].tolist()


@spec("confidence-acceptance/half-life")
def test_aging_counts_tokens_since_the_last_observation():
    est = PrefixEstimate.from_prior(initial_prior(1), tokens=100)
    assert est.aged_weight(100)[0] == 2.0
    assert est.aged_weight(228)[0] == pytest.approx(1.0)  # one half-life later
    assert est.aged_weight(50)[0] == 2.0  # an earlier count never adds weight


def test_observations_must_be_probabilities():
    est = PrefixEstimate.from_prior(initial_prior(2))
    for bad in ([1.5, nan], [nan, -0.5]):
        with pytest.raises(ValueError):
            est.observe(bad, tokens=0)
    est.observe([1.0, 0.0], tokens=0)  # both ends are probabilities


@spec("confidence-acceptance/ordinary-means", "confidence-acceptance/optimistic-estimate")
def test_means_and_optimistic_estimates_are_cached_read_only_until_an_observation():
    est = PrefixEstimate(np.array([0.6, 0.4]), np.array([128.0, 128.0]))
    means, optimistic = est.means(), est.optimistic(0)
    assert est.means() is means and est.optimistic(0) is optimistic  # read every decision, computed once
    with pytest.raises(ValueError):
        means[0] = 1.0
    with pytest.raises(ValueError):
        optimistic[0] = 1.0
    # A different token count ages the weights: a new optimistic estimate, the means unchanged.
    later = est.optimistic(128)
    np.testing.assert_allclose(later, 0.6 - 0.2 * np.arange(2) + math.sqrt(math.log(20) / (2 * 64)))
    assert later[0] > optimistic[0] and est.means() is means
    est.observe([0.0, nan], tokens=128)
    assert est.means() is not means and est.means()[0] < 0.6
    assert est.optimistic(128)[0] < later[0]


@spec(
    "confidence-acceptance/prior-init",
    "confidence-acceptance/initial-weight",
    "confidence-acceptance/half-life",
)
def test_new_estimates_start_from_the_prior_at_the_given_token_count():
    priors = {SOURCE_LEARNED: PopulationPrior(2)}
    fresh = AcceptanceHistory(priors).get(SOURCE_LEARNED)
    assert fresh.tokens_at == 0 and fresh.aged_weight(128)[0] == pytest.approx(1.0)
    resumed = AcceptanceHistory(priors, tokens=50).get(SOURCE_LEARNED)
    assert resumed.tokens_at == 50 and resumed.aged_weight(50)[0] == 2.0
    assert PrefixEstimate.from_prior(initial_prior(2), tokens=7).tokens_at == 7
    # Any numbers make a float estimate that observations can move.
    est = PrefixEstimate.from_prior([1, 0])
    est.observe([0.0, 1.0], tokens=0)
    np.testing.assert_allclose(est.mean, [2 / 3, 1 / 3])


@spec("confidence-acceptance/expected-output")
def test_prefix_survival_is_made_monotone_and_clipped_to_probabilities():
    from helios_jax.scheduler.speculation import monotone

    np.testing.assert_array_equal(monotone(np.array([0.5, 0.7, 0.2, 0.3])), [0.5, 0.5, 0.2, 0.2])
    np.testing.assert_array_equal(monotone(np.array([1.2, 0.9, -0.1])), [1.0, 0.9, 0.0])
    np.testing.assert_array_equal(monotone(np.array([[0.3, 0.4], [2.0, 1.5]])), [[0.3, 0.3], [1.0, 1.0]])
    assert monotone(np.zeros(0)).size == 0
    # Everything the selector reads goes through it: means and expected output alike.
    est = PrefixEstimate(np.array([0.4, 0.6]), np.array([2.0, 2.0]))
    np.testing.assert_array_equal(est.means(), [0.4, 0.4])
    assert expected_output(np.array([0.4, 0.6]), 3) == pytest.approx(1.8)


def test_pooled_means_follow_the_pool_they_are_asked_about():
    """An estimate's cached means and optimistic estimates belong to one pool: asked about
    another pool at the same revision, it answers from that pool's mean, not from the cache."""
    from helios_jax.scheduler.speculation import PrefixEstimate

    est = PrefixEstimate.from_prior(np.array([0.5, 0.25]))
    low = PrefixEstimate.from_prior(np.array([0.02, 0.01]))
    high = PrefixEstimate.from_prior(np.array([0.1, 0.05]))
    assert low.revision == high.revision
    assert est.means(low) == pytest.approx([0.02, 0.01])
    assert est.means(high) == pytest.approx([0.1, 0.05])
    bonus = math.sqrt(math.log(20) / (2 * 2.0))  # at the initial weight 2: 0.865
    assert est.optimistic(0, low)[0] == pytest.approx(0.02 + bonus)
    assert est.optimistic(0, high)[0] == pytest.approx(0.1 + bonus)
