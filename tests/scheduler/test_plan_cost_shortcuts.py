"""Cheap decisions (issue 14), fourth round: each shortcut equals the plain computation it
replaces, and each test fails when the shortcut is dropped or widened."""

from __future__ import annotations

import numpy as np
import pytest

from helios_jax.scheduler import rounds, utility
from helios_jax.scheduler.rounds import prefix_allocation_order


def _random_case(rng: np.random.Generator, n: int, depth: int, distinct: bool):
    """Adaptive ragged inputs; `distinct`: lanes whose three orderings differ (else every lane's
    extension is proportional to its pending value, so the orderings coincide)."""
    base = rng.uniform(0.5, 2.0, n)
    if distinct:
        extension = rng.uniform(0.0, 3.0, (n, depth))
        ceilings = rng.integers(1, depth + 2, n)
    else:
        extension = base[:, None] * np.linspace(0.9, 0.3, depth)[None, :]
        ceilings = np.full(n, depth + 1)
    lanes, depths = prefix_allocation_order(extension, ceilings)
    return base, extension, ceilings, lanes, depths


def _plain(monkeypatch, args, batch, rows):
    """adaptive_ragged with every ordering evaluated (no repeated ordering skipped)."""
    with monkeypatch.context() as m:
        m.setattr(utility, "_repeats", lambda order, earlier: False)
        return utility.adaptive_ragged(*args, batch, rows)


@pytest.mark.parametrize("distinct", [False, True])
def test_adaptive_ragged_skipping_repeated_orderings_equals_every_ordering(monkeypatch, distinct):
    """A repeated ordering gives the same prefixes and totals, which only tie: skipping it
    changes no cohort, allocation or total (bit for bit)."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        n, depth = int(rng.integers(1, 12)), int(rng.integers(1, 5))
        args = _random_case(rng, n, depth, distinct)
        batch, rows = int(rng.integers(1, n + 2)), int(rng.integers(1, n * (depth + 1) + 2))
        got = utility.adaptive_ragged(*args, batch, rows)
        want = _plain(monkeypatch, args, batch, rows)
        assert got.total == want.total, trial
        assert got.cohort == want.cohort, trial
        assert got.rows.tolist() == want.rows.tolist(), trial


def _prefix_calls(monkeypatch, args, batch, rows) -> int:
    calls = []
    real = utility._ordering_prefixes
    with monkeypatch.context() as m:
        m.setattr(utility, "_ordering_prefixes", lambda *a: calls.append(1) or real(*a))
        utility.adaptive_ragged(*args, batch, rows)
    return len(calls)


def test_adaptive_ragged_evaluates_each_distinct_ordering_once(monkeypatch):
    """Coinciding orderings are evaluated once; three distinct ones three times."""
    rng = np.random.default_rng(3)
    assert _prefix_calls(monkeypatch, _random_case(rng, 8, 3, distinct=False), 4, 12) == 1
    # Lane 0 leads by full value, lane 1 by pending value, lane 2 by full value per row.
    base = np.array([1.0, 2.0, 0.5])
    extension = np.array([[3.0, 3.0], [0.0, 0.0], [2.5, 0.0]])
    ceilings = np.array([3, 1, 2])
    lanes, depths = prefix_allocation_order(extension, ceilings)
    assert _prefix_calls(monkeypatch, (base, extension, ceilings, lanes, depths), 1, 3) == 3


def test_cohort_rows_with_room_for_every_ceiling_equal_the_greedy(monkeypatch):
    """When the rows reach every lane's ceiling, the allocation is the ceilings (the greedy's
    end) without running the frontier; one row short, the frontier decides who waits."""
    prob = np.array([[0.9, 0.2, 0.1], [0.6, 0.5, 0.4], [0.3, 0.3, 0.3]])
    ceilings = np.array([4, 2, 3])
    calls = []
    real = rounds._greedy
    monkeypatch.setattr(rounds, "_greedy", lambda *a: calls.append(1) or real(*a))
    for capacity in (9, 10, 12):
        got = rounds.allocate_cohort_rows(prob, ceilings, capacity)
        assert got.dtype == np.int32
        assert got.tolist() == [4, 2, 3]
    assert calls == []
    assert rounds.allocate_cohort_rows(prob, ceilings, 8).tolist() == [3, 2, 3]
    assert rounds.allocate_cohort_rows(prob, ceilings, 7).tolist() == [2, 2, 3]
    assert len(calls) == 2
    with pytest.raises(ValueError, match="NaN"):
        rounds.allocate_cohort_rows(np.full_like(prob, np.nan), ceilings, 12)
