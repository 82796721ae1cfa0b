"""The exact cohort tables behind the selector (helios_jax/scheduler/utility.py)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.scheduler import utility

spec = pytest.mark.spec


@spec("prerequisites/pair-exact")
def test_ragged_pair_ties_take_the_cohort_with_fewer_rows():
    """Two already-ready lanes of equal value, one needing 1 target row and one needing 3: with
    room for one of them behind the newly ready lane, the totals tie and the cohort that uses
    fewer of the follower's rows wins (the same value for less verification work)."""
    new_v, new_w = np.array([1.0]), np.array([1])
    ready_v, ready_w = np.array([5.0, 5.0]), np.array([3, 1])
    total, new, ready, terminal = utility.best_ragged_pair(new_v, new_w, ready_v, ready_w, [], 1, 2, 5)
    assert total == pytest.approx(6.0) and new == [0] and terminal == 0
    assert ready == [1]
    ready_v, ready_w = ready_v[::-1].copy(), ready_w[::-1].copy()  # whatever the lanes' order
    assert utility.best_ragged_pair(new_v, new_w, ready_v, ready_w, [], 1, 2, 5)[2] == [0]


@spec("duration-estimates/tie-order")
def test_adaptive_ragged_takes_equal_lanes_in_the_order_given():
    """Twenty lanes, six of them decoys whose single extension row is worth much more than their
    pending row. With B = P = 4 no extension row fits, so the ordering by pending-row value wins
    (total 4 against 2 for the orderings that put the decoys first) and must cut inside fourteen
    identical lanes: it takes the first four as given (the selection lists views least recently
    used first), not any four."""
    n = 20
    decoy = np.zeros(n, dtype=bool)
    decoy[[1, 4, 5, 10, 11, 15]] = True
    base = np.where(decoy, 0.5, 1.0)
    extension = np.zeros((n, 3))
    extension[decoy, 0] = 9.5
    ceilings = np.where(decoy, 2, 1)
    none = np.zeros(0, dtype=np.int64)
    total, cohort, alloc = utility.adaptive_ragged(base, extension, ceilings, none, none, 4, 4)
    assert total == pytest.approx(4.0)
    assert cohort == [0, 2, 3, 6]
    assert alloc.tolist() == [1 if i in cohort else 0 for i in range(n)]


def test_nearly_equal_holds_for_equal_values_and_at_the_tolerance():
    """Equal values are always nearly equal, and a difference of exactly REL_TIE (relative to
    the larger magnitude, at least 1) still is: the tie rules apply there."""
    assert utility.nearly_equal(2.0, 2.0) and utility.nearly_equal(0.0, 0.0)
    assert utility.nearly_equal(0.0, utility.REL_TIE)
    assert not utility.nearly_equal(0.0, 2 * utility.REL_TIE)


def test_a_later_ordering_wins_only_beyond_the_tie_tolerance():
    """Two lanes, B = P = 1 (no extension row fits): the ordering by full value takes lane 0
    (0.5 now, a large extension), the ordering by pending value lane 1 (0.5 + 1.5e-9). Below a
    magnitude of 1 the tie tolerance is absolute, 1e-9: lane 1 is better beyond it and wins; at
    0.5 + 0.5e-9 the two tie and the earlier ordering's lane 0 stays."""
    none = np.zeros(0, dtype=np.int64)
    extension = np.array([[5.0], [0.0]])
    ceilings = np.array([2, 1])
    for gap, winner in ((1.5e-9, 1), (0.5e-9, 0)):
        base = np.array([0.5, 0.5 + gap])
        _, cohort, _ = utility.adaptive_ragged(base, extension, ceilings, none, none, 1, 1)
        assert cohort == [winner], gap


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 10.0), max_size=12),
    st.lists(st.floats(0.0, 10.0), max_size=12),
    st.lists(st.floats(0.0, 10.0), max_size=6),
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(0, 1),
)
def test_few_ks_are_summed_as_the_array_form_sums_them(new, ready, terminal, b1, b2, min_new):
    """best_pair_of_prefixes sums fewer than SMALL_PAIR values of k one at a time: the same
    choice and the same total, bit for bit (ties: the first k), as the array form, which it
    takes for every k when SMALL_PAIR is 0."""
    prefixes = [utility.descending_prefix(np.array(x, dtype=np.float64)) for x in (new, ready, terminal)]
    got = utility.best_pair_of_prefixes(*prefixes, b1, b2, min_new=min_new)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(utility, "SMALL_PAIR", 0)
        want = utility.best_pair_of_prefixes(*prefixes, b1, b2, min_new=min_new)
    assert got == want
    assert got is None or all(type(x) is t for x, t in zip(got, (float, int, int, int)))
