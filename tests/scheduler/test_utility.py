"""The exact cohort tables behind the selector (helios_jax/scheduler/utility.py)."""
import numpy as np
import pytest

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
