"""Host statement of the device allocation against the shared golden cases and the oracle."""

import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.reference.prefix_allocation import prefix_allocation_naive
from helios_jax.scheduler.rounds import (
    allocate_cohort_rows,
    allocate_prefix_rows,
    forecast_observations,
    prefix_allocation_order,
)

spec = pytest.mark.spec
GOLDEN = json.loads((pathlib.Path(__file__).parents[1] / "golden" / "prefix_allocation.json").read_text())


@spec(
    "speculative-coverage/device-frontier",
    "speculative-coverage/frontier-ties",
    "speculative-coverage/ceilings-over-p",
)
@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["name"] for c in GOLDEN["cases"]])
def test_host_allocation_matches_golden_cases(case):
    got = allocate_prefix_rows(case["joint_prob"], case["ceilings"], case["active"], case["capacity"])
    np.testing.assert_array_equal(got, case["expected"])


def test_docstring_example():
    assert allocate_prefix_rows([[0.9, 0.5], [0.6, 0.6]], [3, 3], [True, True], 4).tolist() == [2, 2]


@st.composite
def problems(draw, monotone=False):
    b = draw(st.integers(1, 6))
    d = draw(st.integers(1, 5))
    grid = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
    prob = np.array(draw(st.lists(st.lists(grid, min_size=d, max_size=d), min_size=b, max_size=b)))
    if monotone:
        prob = np.minimum.accumulate(prob, axis=1)
    active = np.array(draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    ceilings = np.array(draw(st.lists(st.integers(1, d + 1), min_size=b, max_size=b)))
    capacity = int(active.sum()) + draw(st.integers(0, 12))
    return prob, ceilings, active, capacity


@spec("speculative-coverage/device-frontier", "speculative-coverage/ceiling-bound")
@settings(max_examples=300, deadline=None)
@given(problems())
def test_host_allocation_equals_the_naive_oracle(p):
    prob, ceilings, active, capacity = p
    got = allocate_prefix_rows(prob, ceilings, active, capacity)
    np.testing.assert_array_equal(got, prefix_allocation_naive(prob, ceilings, active, capacity))
    assert got.sum() <= capacity
    assert (
        (got[active] >= 1).all()
        and (got[~active] == 0).all()
        and (got <= np.where(active, ceilings, 0)).all()
    )


@settings(max_examples=200, deadline=None)
@given(problems())
def test_cohort_allocation_equals_the_naive_oracle(p):
    """The selector's unchecked entry (every lane active) allocates as the device does."""
    prob, ceilings, _, capacity = p
    b = prob.shape[0]
    capacity = max(capacity, b)
    got = allocate_cohort_rows(prob, ceilings, capacity)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, prefix_allocation_naive(prob, ceilings, np.ones(b, bool), capacity))
    with pytest.raises(ValueError, match="NaN"):
        allocate_cohort_rows(np.full_like(prob, np.nan), ceilings, capacity)


@settings(max_examples=300, deadline=None)
@given(problems(monotone=True))
def test_sorted_order_equals_greedy_frontier_for_monotone_inputs(p):
    """The selector prices many cohorts with one sort; it must equal the frontier on monotone rows."""
    prob, ceilings, active, capacity = p
    ceilings = np.where(active, ceilings, 1)
    lanes, depths = prefix_allocation_order(prob, ceilings)
    lengths = active.astype(int).copy()
    room = capacity - active.sum()
    for lane in lanes:
        if room == 0:
            break
        if active[lane]:
            lengths[lane] += 1
            room -= 1
    np.testing.assert_array_equal(lengths, allocate_prefix_rows(prob, ceilings, active, capacity))


def test_bad_inputs():
    with pytest.raises(ValueError, match="capacity"):
        allocate_prefix_rows([[0.5]], [2], [True], 0)
    with pytest.raises(ValueError, match="NaN"):
        allocate_prefix_rows([[np.nan]], [2], [True], 2)
    with pytest.raises(ValueError, match="ceilings"):
        allocate_prefix_rows([[0.5]], [3], [True], 2)


@spec("speculative-coverage/device-frontier", "speculative-coverage/frontier-ties")
def test_ranking_is_in_device_float32_precision():
    """0.5 and 0.5 + 1e-9 are one float32 value: the host, like the device, sees a tie and gives the
    one extra row to the lower lane (both frontiers are at depth 1), not to the f64-larger lane 1;
    the sorted admission order lists lane 0 first for the same reason."""
    prob = [[0.5], [0.5 + 1e-9]]
    assert allocate_prefix_rows(prob, [2, 2], [True, True], 3).tolist() == [2, 1]
    lanes, depths = prefix_allocation_order(np.array(prob), np.array([2, 2]))
    assert lanes.tolist() == [0, 1] and depths.tolist() == [1, 1]


def test_a_ceiling_per_lane_is_required():
    with pytest.raises(ValueError, match="shapes"):
        allocate_prefix_rows([[0.5], [0.5]], [2], [True, True], 3)
    with pytest.raises(ValueError, match="shapes"):
        allocate_prefix_rows([[0.5], [0.5]], [2, 2], [True], 3)


@spec("acceptance-learning/forecast-ceiling")
def test_forecast_observations_stop_at_the_ceiling_the_row_and_the_tracked_depth():
    """Ceiling c observes depths 1..c-1: a width-one lane (c = 1) observes nothing; a row holding
    two probabilities observes two depths even under ceiling 4; a tracked depth of 2 keeps two."""
    assert np.isnan(forecast_observations([0.7, 0.5], 1, 2)).all()
    np.testing.assert_array_equal(forecast_observations([0.9, 0.8], 4, 5), [0.9, 0.8, np.nan, np.nan, np.nan])
    np.testing.assert_array_equal(forecast_observations([0.9, 0.8, 0.7], 4, 2), [0.9, 0.8])
    np.testing.assert_array_equal(forecast_observations([0.9, 0.8, 0.7], 3, 3), [0.9, 0.8, np.nan])
