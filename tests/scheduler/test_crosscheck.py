"""The production selector against exhaustive enumeration (reference/cohorts.py).

A few hundred seeded populations per catalog run in the suite; set HELIOS_CROSSCHECK_CASES for
thousands (``python -m helios_jax.reference.crosscheck`` does the same from the command line).
"""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helios_jax.reference import crosscheck
from helios_jax.reference.cohorts import best_pair_naive
from helios_jax.scheduler import utility

from .helpers import ORDINARY, RAGGED, SPEC

spec = pytest.mark.spec
CASES = int(os.environ.get("HELIOS_CROSSCHECK_CASES", "150"))


@spec("verification/mixed-exhaustive", "useful-service/unconstrained-top-lanes", "useful-service/constrained-ragged",
      "useful-service/dominance-prune", "useful-service/dominance-mixed", "useful-service/dominance-speculative",
      "mixed-execution/compare-populations", "useful-service/fixed-complete-prefixes", "verification/cpu-only")
@pytest.mark.parametrize("catalog, max_requests", [(SPEC, 5), (ORDINARY, 5), (RAGGED, 7)],
                         ids=["speculative", "ordinary", "ragged-small"])
def test_production_matches_enumeration(catalog, max_requests):
    report = crosscheck.run(catalog, CASES, seed=7, max_requests=max_requests, noise=0.15)
    assert report.cases == CASES and report.exact_cases > CASES
    assert report.mismatches == 0, report.details[:3]
    # Adaptive ragged search is bounded by design; on these populations it loses little.
    assert report.worst_relative_gap < 0.05


def test_command_line_prints_one_json_line():
    out = subprocess.run([sys.executable, "-m", "helios_jax.reference.crosscheck", "--cases=20", "--seed=3"],
                         capture_output=True, text=True, check=True)
    line = out.stdout.strip()
    assert line.startswith('{"cases": 20, "exact_cases": ') and '"mismatches": 0' in line


@spec("useful-service/constrained-ragged")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.integers(1, 4)), min_size=1, max_size=7),
       st.integers(1, 5), st.integers(1, 12))
def test_fixed_ragged_solver_is_exact(lanes, batch, rows):
    values = np.array([v for v, _ in lanes])
    weights = np.array([w for _, w in lanes])
    total, chosen = utility.fixed_ragged(values, weights, batch, rows)
    best = 0.0
    for k in range(1, min(batch, len(lanes)) + 1):
        for subset in itertools.combinations(range(len(lanes)), k):
            if weights[list(subset)].sum() <= rows:
                best = max(best, values[list(subset)].sum())
    assert total == pytest.approx(best)
    assert len(chosen) <= batch and weights[chosen].sum() <= rows
    assert values[chosen].sum() == pytest.approx(total)


@spec("prerequisites/pair-exact", "prerequisites/prefix-sums", "prerequisites/enumerate-k",
      "prerequisites/fill-following", "prerequisites/fill-prerequisite", "prerequisites/one-newly-ready",
      "prerequisites/additive-lanes")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), max_size=4), st.lists(st.floats(0.0, 10.0), max_size=4),
       st.lists(st.floats(0.0, 10.0), max_size=3), st.integers(1, 4), st.integers(1, 4), st.integers(0, 1))
def test_pair_solver_is_exact(new, ready, terminal, b1, b2, min_new):
    got = utility.best_pair(np.array(new), np.array(ready), np.array(terminal), b1, b2, min_new=min_new)
    want = best_pair_naive(new, ready, terminal, b1, b2, min_new=min_new)
    if want is None:
        assert got is None
    else:
        assert got[0] == pytest.approx(want)
        assert got[1] >= min_new
