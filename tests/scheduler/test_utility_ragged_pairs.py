"""The exact ragged cohort tables (``utility.ragged_table``) and the prerequisite pair search of a
host-allocated ragged follower (``utility.best_ragged_pair``), against independent computations:
every subset of lanes, a lane-by-lane knapsack, the tie order of identical lanes
(docs/spec/RESOLUTIONS.md entry 24) and the pair search's tie tolerance."""

import itertools

import numpy as np
import pytest

from helios_jax.scheduler import utility

NONE_F, NONE_I = np.zeros(0), np.zeros(0, dtype=np.int64)


def _enumerated(values, weights, batch, rows):
    """best[j, r] over every subset of exactly j lanes using exactly r target rows."""
    best = np.full((batch + 1, rows + 1), -np.inf)
    n = len(values)
    for size in range(min(n, batch) + 1):
        for subset in itertools.combinations(range(n), size):
            used = int(sum(weights[i] for i in subset))
            if used <= rows:
                best[size, used] = max(best[size, used], float(sum(values[i] for i in subset)))
    return best


def _knapsack(values, weights, batch, rows):
    """The same table by a 0/1 knapsack over the lanes one at a time (no weight classes)."""
    f = np.full((batch + 1, rows + 1), -np.inf)
    f[0, 0] = 0.0
    for v, w in zip(values, weights):
        if w <= rows:
            g = f.copy()
            g[1:, w:] = np.maximum(g[1:, w:], f[:-1, : rows + 1 - w] + v)
            f = g
    return f


def _check_cohorts(table, values, weights):
    """Every finite cell rebuilds to a cohort of exactly j lanes, r rows and that total."""
    for j, r in zip(*np.nonzero(np.isfinite(table.best))):
        lanes = table.cohort(int(j), int(r))
        assert len(lanes) == j == len(set(lanes))
        assert int(np.sum(weights[lanes])) == r
        assert float(np.sum(values[lanes])) == pytest.approx(table.best[j, r], abs=1e-9)


def test_ragged_table_equals_every_subset_on_small_instances():
    """Random small lane sets (zero-value lanes, repeated values and weights, B and P from
    tight to loose): best[j, r] is the best total of exactly j lanes on exactly r rows, -inf
    where no such cohort exists, and each finite cell's cohort attains it."""
    rng = np.random.default_rng(26)
    for _ in range(120):
        n = int(rng.integers(0, 7))
        values = rng.choice([0.0, 1.0, 2.5, 4.0], size=n) + rng.choice([0.0, 0.125], size=n)
        weights = rng.integers(1, 5, size=n)
        batch, rows = int(rng.integers(0, 5)), int(rng.integers(0, 9))
        table = utility.ragged_table(values, weights, batch, rows)
        want = _enumerated(values, weights, batch, rows)
        assert table.best.shape == want.shape
        assert np.array_equal(np.isfinite(table.best), np.isfinite(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(table.best[finite], want[finite], atol=1e-12)
        _check_cohorts(table, values, weights)


def test_fixed_ragged_fills_capacity_exactly_or_leaves_it():
    """fixed_ragged: the capacity exactly filled (P = 4 by lanes of 1 and 3 rows beats two
    lanes of 2 rows), B binding before P, and nothing fitting gives the empty cohort."""
    values, weights = np.array([3.0, 2.0, 2.0, 1.5]), np.array([3, 2, 2, 1])
    assert utility.fixed_ragged(values, weights, 2, 4) == (4.5, [0, 3])
    assert utility.fixed_ragged(values, weights, 1, 8) == (3.0, [0])
    assert utility.fixed_ragged(values, np.array([5, 6, 7, 9]), 3, 4) == (0.0, [])


def test_identical_lanes_enter_a_ragged_cohort_in_the_order_given():
    """Thirty lanes in three value levels and two weights (numpy's default sort is unstable
    past 16 elements): every cell of the table matches a lane-by-lane knapsack, and whenever a
    cohort holds one of two identical lanes (same value, same rows) it holds the earlier listed
    one, the one the selection ordered first (RESOLUTIONS 24: lanes sort stably by value)."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        values = rng.choice([1.0, 2.0, 3.0], size=30)
        weights = rng.choice([1, 2], size=30)
        batch, rows = 12, 17
        table = utility.ragged_table(values, weights, batch, rows)
        assert np.array_equal(table.best, _knapsack(values, weights, batch, rows))
        _check_cohorts(table, values, weights)
        for j, r in zip(*np.nonzero(np.isfinite(table.best))):
            chosen = set(table.cohort(int(j), int(r)))
            for later in chosen:
                twins = np.flatnonzero((values == values[later]) & (weights == weights[later]))
                assert all(i in chosen for i in twins[twins < later]), (seed, j, r, later)


def test_ragged_totals_are_double_precision_sums_whatever_the_input_dtype():
    """Lane and terminal values given in float32 (as device outputs are) are summed in double
    precision: 2**24 + 1 + 1 is exact in float64 and would round back to 2**24 in float32."""
    big = float(2**24)
    lanes = np.array([big, 1.0, 1.0], dtype=np.float32)
    table = utility.ragged_table(lanes, np.array([1, 1, 1]), 3, 3)
    assert table.best[3, 3] == big + 2.0 and table.cohort(3, 3) == [0, 1, 2]
    assert utility.fixed_ragged(lanes, np.array([1, 1, 1]), 3, 3)[0] == big + 2.0
    got = utility.best_ragged_pair(lanes, np.array([1, 1, 1]), NONE_F, NONE_I, [], 3, 3, 3)
    assert got.total == big + 2.0 and got.new == [0, 1, 2]
    one = np.array([1.0])
    got = utility.best_ragged_pair(one, np.array([1]), NONE_F, NONE_I, lanes, 4, 1, 1)
    assert got.total == big + 3.0 and got.new == [0] and got.terminal_count == 3


def _pair_k(new_values):
    """The newly ready lanes best_ragged_pair takes from two one-row lanes, with room for both
    (B1 = B2 = P = 2) and nothing else to serve: k = 1 or k = 2."""
    got = utility.best_ragged_pair(np.array(new_values), np.array([1, 1]), NONE_F, NONE_I, [], 2, 2, 2)
    return got.new


def test_a_larger_k_wins_only_beyond_the_tie_tolerance():
    """The search runs k upward and a larger k replaces the kept cohort only when its total is
    beyond the kept one's by more than REL_TIE * max(1, |total|) (utility.nearly_equal's
    tolerance; best_pair likewise keeps the first best k): a zero-value lane is not added, a
    gain of exactly the tolerance is a tie, and the tolerance is absolute below a total of 1
    and relative above it."""
    tol = utility.REL_TIE
    assert _pair_k([1.0, 0.0]) == [0]  # equal totals: the smaller k stays
    assert _pair_k([tol, tol]) == [0]  # 2e-9 against 1e-9: exactly the tolerance, a tie
    assert utility.nearly_equal(tol, 2 * tol)
    assert _pair_k([0.5, 1.5 * tol]) == [0, 1]  # beyond the absolute tolerance below 1
    assert _pair_k([1000.0, 100 * tol]) == [0]  # 1e-10 relative at 1000: a tie
    assert _pair_k([1000.0, 2000 * tol]) == [0, 1]  # 2e-9 relative: beyond it


def test_best_ragged_pair_equals_enumeration_with_ties_and_min_new():
    """Integer-valued lanes (many exact ties, zero values included) and min_new 0..2: the total
    is the best over every cohort with at least min_new and at most B1 newly ready lanes, B2
    lanes and P rows in all, the prerequisite's other rows to the best terminal rows; and among
    the optimal cohorts it takes the fewest newly ready lanes."""
    rng = np.random.default_rng(11)
    for _ in range(150):
        n_new, n_ready, n_term = (int(x) for x in rng.integers(0, 4, size=3))
        new_v, ready_v = rng.integers(0, 4, n_new) * 1.0, rng.integers(0, 4, n_ready) * 1.0
        new_w, ready_w = rng.integers(1, 4, n_new), rng.integers(1, 4, n_ready)
        term = np.sort(rng.integers(0, 4, n_term) * 1.0)[::-1]
        b1, b2, rows, min_new = (
            int(x) for x in (*rng.integers(1, 4, size=2), rng.integers(1, 8), rng.integers(0, 3))
        )
        best = {}
        for kn in range(n_new + 1):
            for kr in range(n_ready + 1):
                if not min_new <= kn <= b1 or kn + kr > b2:
                    continue
                for ni in itertools.combinations(range(n_new), kn):
                    for ri in itertools.combinations(range(n_ready), kr):
                        if new_w[list(ni)].sum() + ready_w[list(ri)].sum() <= rows:
                            v = new_v[list(ni)].sum() + ready_v[list(ri)].sum() + term[: b1 - kn].sum()
                            best[kn] = max(best.get(kn, -np.inf), v)
        got = utility.best_ragged_pair(new_v, new_w, ready_v, ready_w, term, b1, b2, rows, min_new=min_new)
        if not best:
            assert got is None
            continue
        top = max(best.values())
        assert got.total == top and len(got.new) == min(k for k, v in best.items() if v == top)
        assert new_v[got.new].sum() + ready_v[got.ready].sum() + term[: got.terminal_count].sum() == top
        assert new_w[got.new].sum() + ready_w[got.ready].sum() <= rows
        assert got.terminal_count == min(b1 - len(got.new), n_term)


def test_equal_totals_of_different_class_mixes_take_the_fewest_heavy_lanes():
    """``ragged_table``'s documented tie: two cohorts of two lanes on four rows, one of a 1-row and
    a 3-row lane and one of two 2-row lanes, total 4 each: the one with no 3-row lane is kept,
    wherever the lanes are listed (the tie goes by weight, not by position)."""
    assert utility.fixed_ragged(np.array([1.0, 3, 2, 2]), np.array([1, 3, 2, 2]), 2, 4) == (4.0, [2, 3])
    assert utility.fixed_ragged(np.array([2.0, 2, 1, 3]), np.array([2, 2, 1, 3]), 2, 4) == (4.0, [0, 1])
    t = utility.ragged_table(np.array([1.0, 3, 2, 2]), np.array([1, 3, 2, 2]), 2, 4)
    assert t.cohort(2, 4) == [2, 3]
