"""Plain data crossing the scheduler boundary (plan.py)."""

import math

import numpy as np
import pytest

from helios_jax.scheduler.plan import validate_probabilities


@pytest.mark.parametrize("values", [[0.0, 1.0], [0.5], []])
def test_probabilities_in_the_closed_unit_interval_pass(values):
    validate_probabilities("survival", np.asarray(values, dtype=float))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1e-9, 1.0 + 1e-9, 2.0])
def test_anything_else_is_rejected_with_the_name(bad):
    with pytest.raises(ValueError, match="survival"):
        validate_probabilities("survival", np.asarray([0.5, bad, 0.5]))
