"""Adaptive ragged selection (``utility.adaptive_ragged``) against the spec's rule enumerated by
hand, and the tie tolerance (``utility.nearly_equal``).

The rule (docs/spec/scheduling-runtime-design.md, "Adaptive ragged selection"): cohort prefixes
under three bounded orderings (total lane value, pending-token value, value per target row), each
cohort priced by the causal allocation it gets: its pending rows and, of the remaining rows, the
first extension rows in allocation order that belong to its lanes. A lane's total value counts
only the extension rows under its ceiling (rows including the pending token); lanes of equal
sort key keep the order given (least recently used first); a later ordering replaces an earlier
one only when better beyond the tie tolerance.
"""

import numpy as np
import pytest

from helios_jax.scheduler import utility
from helios_jax.scheduler.rounds import prefix_allocation_order


def _by_hand(base, extension, ceilings, lanes, depths, batch, rows):
    """The rule enumerated in plain Python: every prefix of the three orderings (Python's sort is
    stable), each priced by its causal allocation; a later prefix wins only when strictly better
    beyond REL_TIE. Returns (total, cohort, rows per lane)."""
    n = len(base)
    full = [base[i] + sum(extension[i][d] for d in range(ceilings[i] - 1)) for i in range(n)]
    keys = (lambda i: -full[i], lambda i: -base[i], lambda i: -(full[i] / ceilings[i]))
    best = None
    for key in keys:
        order = sorted(range(n), key=key)
        for m in range(1, min(batch, n, rows) + 1):
            members = set(order[:m])
            alloc = [1 if i in members else 0 for i in range(n)]
            total, room = sum(base[i] for i in order[:m]), rows - m
            for lane, depth in zip(lanes.tolist(), depths.tolist()):
                if room and lane in members:
                    total, room = total + extension[lane][depth - 1], room - 1
                    alloc[lane] += 1
            if best is None or total > best[0] + utility.REL_TIE * max(1.0, abs(best[0])):
                best = (total, sorted(members), alloc)
    return best


def _lanes_of_few_kinds(rng, n, depth):
    """n lanes drawn from three kinds (many identical lanes: ties in every ordering), values in
    quarters (exact sums); extension rows do not increase with depth and go on past the ceiling."""
    kinds = rng.integers(1, 9, 3) / 4.0
    ext = np.sort(rng.integers(0, 13, (3, depth)) / 4.0, axis=1)[:, ::-1]
    ceil = rng.integers(1, depth + 1, 3)  # below depth + 1: the last extension rows are past it
    kind = rng.integers(0, 3, n)
    return kinds[kind], ext[kind].copy(), ceil[kind]


@pytest.mark.parametrize("seed", range(6))
def test_adaptive_ragged_equals_the_three_orderings_enumerated_by_hand(seed):
    """Many identical lanes (so each ordering cuts inside a run of equal keys, and the order given
    decides which lanes are taken) whose extension rows continue past their ceilings (never part of
    a lane's total value): the selection equals the enumeration, in total, cohort and rows."""
    rng = np.random.default_rng(seed)
    for trial in range(12):
        n, depth = int(rng.integers(17, 25)), int(rng.integers(2, 4))
        base, extension, ceilings = _lanes_of_few_kinds(rng, n, depth)
        lanes, depths = prefix_allocation_order(extension, ceilings)
        batch, rows = int(rng.integers(1, n)), int(rng.integers(1, 2 * n))
        got = utility.adaptive_ragged(base, extension, ceilings, lanes, depths, batch, rows)
        want = _by_hand(base.tolist(), extension.tolist(), ceilings.tolist(), lanes, depths, batch, rows)
        assert (got.total, got.cohort, got.rows.tolist()) == want, (seed, trial)


def _decoys_and_targets(decoy, target, n=20, decoys=(1, 4, 5, 10, 11, 15)):
    """Twenty lanes: six decoys, fourteen identical target lanes; each kind is (base, extension
    row values, ceiling). Returns base, extension, ceilings, allocation lanes and depths."""
    is_decoy = np.zeros(n, dtype=bool)
    is_decoy[list(decoys)] = True
    base = np.where(is_decoy, decoy[0], target[0])
    extension = np.where(is_decoy[:, None], np.array(decoy[1]), np.array(target[1]))
    ceilings = np.where(is_decoy, decoy[2], target[2])
    lanes, depths = prefix_allocation_order(extension, ceilings)
    return base, extension, ceilings, lanes, depths


def test_the_total_value_ordering_takes_equal_lanes_in_the_order_given():
    """Targets are worth 1 + 1 (one proposal, ceiling 2), decoys 1.5 at once and nothing more:
    by pending value and by value per row the decoys come first (4 x 1.5 = 6 with B = 4, P = 8),
    by total value the targets (4 x 2 = 8), which wins and must cut inside fourteen equal lanes:
    the first four as given, each with its proposal."""
    args = _decoys_and_targets((1.5, [0.0], 1), (1.0, [1.0], 2))
    got = utility.adaptive_ragged(*args, 4, 8)
    assert got.total == 8.0 and got.cohort == [0, 2, 3, 6]
    assert got.rows.tolist() == [2 if i in got.cohort else 0 for i in range(20)]


def test_the_value_per_row_ordering_takes_equal_lanes_in_the_order_given():
    """Twenty lanes of three kinds (base, extension rows, ceiling), B = 6, P = 12:
    - four leaders (2, [3, 0], 2): 5 in two rows, 2.5 per row;
    - twelve equal targets (2, [2.75, 0], 2): 4.75 in two rows, 2.375 per row;
    - four decoys (1.25, [2.25, 2.25], 3): 5.75 in three rows, first by total value.
    By value per row the four leaders and two targets take two rows each: 4 x 5 + 2 x 4.75 = 29.5.
    By pending value leaders and targets tie and the first six as given hold one leader (28.75); by
    total value the decoys come first (at most 24). The winning ordering cuts inside twelve equal
    targets and takes the first two as given, lanes 0 and 2."""
    leaders, decoys = [1, 10, 16, 18], [7, 11, 12, 17]
    kind = np.array([2 if i in leaders else 1 if i in decoys else 0 for i in range(20)])
    base = np.array([2.0, 1.25, 2.0])[kind]
    extension = np.array([[2.75, 0.0], [2.25, 2.25], [3.0, 0.0]])[kind]
    ceilings = np.array([2, 3, 2])[kind]
    lanes, depths = prefix_allocation_order(extension, ceilings)
    got = utility.adaptive_ragged(base, extension, ceilings, lanes, depths, 6, 12)
    assert got.total == 29.5 and got.cohort == [0, 1, 2, 10, 16, 18]
    assert got.rows.tolist() == [2 if i in got.cohort else 0 for i in range(20)]


def _host(base, extension, ceilings, batch, rows, **kw):
    """adaptive_ragged with host allocation (extension rows by marginal value)."""
    base, extension, ceilings = np.array(base, float), np.array(extension, float), np.array(ceilings)
    lanes, depths = prefix_allocation_order(extension, ceilings)
    return utility.adaptive_ragged(base, extension, ceilings, lanes, depths, batch, rows, **kw)


def test_the_value_per_row_ordering_is_searched_after_two_equal_orderings():
    """Total value (9, 4.5, 5.5) and pending value (1.5, 0.5, 1) order the lanes alike (0, 2, 1); a
    repeated ordering is skipped, never the search: value per row (3, 2.25, 1.83) orders them 0, 1,
    2, and with B = 2, P = 5 lanes 0 and 1 take 1.5 + 0.5 + 4 + 4 + 3.5 = 13.5 in three extension
    rows, more than lanes 0 and 2 (2.5 + 4 + 3.5 + 2.5 = 12.5)."""
    got = _host([1.5, 0.5, 1.0], [[4.0, 3.5], [4.0, 0.0], [2.5, 2.0]], [3, 2, 3], 2, 5)
    assert (got.total, got.cohort, got.rows.tolist()) == (13.5, [0, 1], [3, 2, 0])


def test_lanes_of_no_value_still_form_a_cohort():
    """A prefix holds at least one lane: lanes worth nothing give the first lane as given (total 0),
    not an empty cohort, which only a population with no allowed prefix gets."""
    got = _host([0.0, 0.0, 0.0], [[0.0], [0.0], [0.0]], [2, 2, 2], 2, 4)
    assert (got.total, got.cohort) == (0.0, [0])
    assert got.rows.tolist() == [2, 0, 0]


def test_an_ordering_with_no_allowed_prefix_does_not_end_the_search():
    """After a prerequisite a cohort must hold exactly one newly ready lane (bonus -inf for none).
    By total value (and per row) lane 0, not newly ready, comes first and B = P = 1 allows no
    prefix of that ordering; by pending value lane 1, newly ready, does: it is the choice."""
    bonus = np.array([-np.inf, 0.0])
    new = np.array([False, True])
    got = _host([0.5, 1.0], [[5.0], [0.0]], [2, 1], 1, 1, new=new, new_bonus=bonus)
    assert (got.total, got.cohort, got.rows.tolist()) == (1.0, [1], [0, 1])


def test_a_cohort_holds_no_more_newly_ready_lanes_than_the_bonus_allows():
    """new_bonus[k] is defined for k = 0 .. len - 1 newly ready lanes: with [-inf, 0] a cohort
    holds exactly one. Two newly ready lanes worth 3 each, then one other worth 1, B = P = 3: every
    ordering gives 0, 1, 2, whose prefixes of two and three lanes hold two newly ready lanes (not
    allowed, however valuable: 7 for all three), so lane 0 alone (3) is the choice."""
    bonus = np.array([-np.inf, 0.0])
    new = np.array([True, True, False])
    got = _host([3.0, 3.0, 1.0], [[0.0], [0.0], [0.0]], [1, 1, 1], 3, 3, new=new, new_bonus=bonus)
    assert (got.total, got.cohort, got.rows.tolist()) == (3.0, [0], [1, 0, 0])


@pytest.mark.parametrize("scale", [0.5, 1000.0])
def test_a_later_ordering_better_by_exactly_the_tolerance_is_a_tie(scale):
    """Two lanes, B = P = 1: by total value lane 0 (worth `scale` now, a large extension), by
    pending value lane 1, worth `scale` plus exactly the tie tolerance REL_TIE * max(1, scale)
    (a tie, ``nearly_equal``), or half of it: the earlier ordering's lane 0 stays; with twice the
    tolerance lane 1 wins. The tolerance grows with the magnitude above 1."""
    tol = utility.REL_TIE * max(1.0, scale)
    for gap, winner in ((tol, 0), (tol / 2, 0), (2 * tol, 1)):
        assert utility.nearly_equal(scale, scale + gap) == (winner == 0)
        got = _host([scale, scale + gap], [[5 * scale], [0.0]], [2, 1], 1, 1)
        assert got.cohort == [winner], (scale, gap)


def test_no_lanes_gives_an_empty_cohort_of_no_value():
    """With no lanes there is no prefix: the choice is the empty cohort, total 0.0 and an empty
    i64 row vector, exactly what a population with no allowed prefix gets (one zero per lane)."""
    none = np.zeros(0, dtype=np.int64)
    got = utility.adaptive_ragged(np.zeros(0), np.zeros((0, 2)), none, none, none, 4, 8)
    assert got.total == 0.0 and isinstance(got.total, float) and got.cohort == []
    assert got.rows.shape == (0,) and got.rows.dtype == np.int64
    # One lane whose only cohort is not allowed (no newly ready lane after a prerequisite).
    blocked = utility.adaptive_ragged(
        np.ones(1), np.zeros((1, 2)), np.ones(1, dtype=np.int64), none, none, 4, 8,
        new=np.zeros(1, dtype=bool), new_bonus=np.array([-np.inf, 0.0]),
    )  # fmt: skip
    assert (blocked.total, blocked.cohort, blocked.rows.dtype) == (0.0, [], np.int64)
    assert blocked.rows.tolist() == [0]


def test_nearly_equal_is_symmetric_at_the_tolerance():
    """The tie tolerance is REL_TIE times the larger magnitude (at least 1), so it does not depend
    on the order of its arguments: 1e9 and 1e9 - 1 differ by exactly REL_TIE * 1e9 (a tie either
    way round), though by more than REL_TIE times the smaller one; one more unit is no tie."""
    big, small = 1e9, 1e9 - 1.0
    assert utility.nearly_equal(big, small) and utility.nearly_equal(small, big)
    assert utility.nearly_equal(-big, -small) and utility.nearly_equal(-small, -big)
    assert not utility.nearly_equal(big, small - 1.0) and not utility.nearly_equal(small - 1.0, big)
    for a, b in [(1e9, 1e9 - 1.0), (3.0, 3.0 - 3e-9), (1e12, 1e12 - 1e3), (0.5, 0.5 + 1e-9)]:
        assert utility.nearly_equal(a, b) == utility.nearly_equal(b, a), (a, b)
