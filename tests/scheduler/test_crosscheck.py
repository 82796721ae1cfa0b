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
from hypothesis import given, settings
from hypothesis import strategies as st

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.reference import cohorts, crosscheck
from helios_jax.reference.cohorts import best_pair_naive
from helios_jax.reference.prefix_allocation import prefix_allocation_naive
from helios_jax.scheduler import policy, service, utility
from helios_jax.scheduler.config import PolicyConfig
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import ORDINARY, RAGGED, SPEC

spec = pytest.mark.spec
CASES = int(os.environ.get("HELIOS_CROSSCHECK_CASES", "150"))
CATALOG_IDS = ["speculative", "ordinary", "ragged-small", "multistep", "multistep-width-one"]


def _catalogs(max_requests: int) -> list:
    """(catalog, largest population) of each crosschecked catalog (CATALOG_IDS); the small
    ragged catalog always with seven requests."""
    return [
        (SPEC, max_requests),
        (ORDINARY, max_requests),
        (RAGGED, 7),
        (crosscheck.with_decode_steps(ORDINARY, (4, 8)), max_requests),
        (crosscheck.with_decode_steps(SPEC, (4, 8)), max_requests),
    ]


@spec(
    "verification/mixed-exhaustive",
    "useful-service/unconstrained-top-lanes",
    "useful-service/constrained-ragged",
    "useful-service/dominance-prune",
    "useful-service/dominance-mixed",
    "useful-service/dominance-speculative",
    "mixed-execution/compare-populations",
    "useful-service/fixed-complete-prefixes",
    "verification/cpu-only",
)
@pytest.mark.parametrize("catalog, max_requests", _catalogs(5), ids=CATALOG_IDS)
def test_production_matches_enumeration(catalog, max_requests):
    report = crosscheck.run(catalog, CASES, seed=7, max_requests=max_requests, noise=0.15)
    assert report.cases == CASES and report.exact_cases > CASES
    assert report.mismatches == 0, report.details[:3]
    # Adaptive ragged search is bounded by design; on these populations it loses little (the
    # worst: 13.5% on one ragged-small program, docs/benchmarks.md).
    assert report.worst_relative_gap < 0.15


def test_command_line_prints_one_json_line():
    out = subprocess.run(
        [sys.executable, "-m", "helios_jax.reference.crosscheck", "--cases=20", "--seed=3"],
        capture_output=True,
        text=True,
        check=True,
    )
    line = out.stdout.strip()
    assert line.startswith('{"cases": 20, "exact_cases": ') and '"mismatches": 0' in line


@spec("useful-service/constrained-ragged")
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 10.0), st.integers(1, 4)), min_size=1, max_size=7),
    st.integers(1, 5),
    st.integers(1, 12),
)
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


@spec(
    "prerequisites/pair-exact",
    "prerequisites/prefix-sums",
    "prerequisites/enumerate-k",
    "prerequisites/fill-following",
    "prerequisites/fill-prerequisite",
    "prerequisites/one-newly-ready",
    "prerequisites/additive-lanes",
)
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 10.0), max_size=4),
    st.lists(st.floats(0.0, 10.0), max_size=4),
    st.lists(st.floats(0.0, 10.0), max_size=3),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(0, 1),
)
def test_pair_solver_is_exact(new, ready, terminal, b1, b2, min_new):
    got = utility.best_pair(np.array(new), np.array(ready), np.array(terminal), b1, b2, min_new=min_new)
    want = best_pair_naive(new, ready, terminal, b1, b2, min_new=min_new)
    if min_new == 1:  # the default
        assert utility.best_pair(np.array(new), np.array(ready), np.array(terminal), b1, b2) == got
    if want is None:
        assert got is None
    else:
        assert got[0] == pytest.approx(want)
        assert got[1] >= min_new


def _lane_values_case(catalog, rng, max_requests, policy_config):
    """One crosscheck population on `catalog`, a few programs unmeasured: (views, selection
    input, naive objective, mode)."""
    mode, fixed_width = crosscheck.random_mode(rng, catalog)
    graphs = catalog.eligible(mode, fixed_width=fixed_width)
    costs = CostModel(policy_config.estimate_ttl_ns)
    for g in graphs:
        if g.duration_ms is not None and rng.random() > 0.15:  # a few programs stay unmeasured
            costs.observe(g.key, [g.duration_ms * 1e6 * float(np.exp(rng.uniform(-0.15, 0.15)))], 0)
    normalizers = service.Normalizers.measure(catalog.graphs, costs)
    views = crosscheck.random_population(rng, catalog, max_requests, policy_config, normalizers)
    inp = policy.SelectionInput(views, graphs, costs, 0, policy_config, mode)
    return views, inp, cohorts.Objective(views, graphs, costs, policy_config), mode


def _expected(obj, v, rows):
    s = cohorts._survival(v, obj.depth)
    return 1.0 + sum(x**obj.policy.adaptive_verification_alpha for x in s[: rows - 1])


def _device_rows(obj, g, lanes, by_rid):
    """The rows the device gives `lanes` (RESOLUTIONS 20, restated): maximal ceilings
    min(D + 1, W, request limit); a lane that the price-aware frontier (forecast times output
    price) gives fewer rows than the device's own frontier has its ceiling lowered to that many;
    the device then allocates P by forecast alone within the ceilings, lanes in slot order."""
    order = sorted(lanes, key=lambda lane: by_rid[lane.rid].slot)
    views = [by_rid[lane.rid] for lane in order]
    forecast = [cohorts._forecast(v, g.proposal_depth) for v in views]
    limits = [cohorts._lane_limit(v, g) for v in views]
    active = [True] * len(views)
    device = prefix_allocation_naive(forecast, limits, active, g.target_capacity)
    priced = prefix_allocation_naive(
        [[obj.price(v.log_output_price) * p for p in f] for v, f in zip(views, forecast)],
        limits,
        active,
        g.target_capacity,
    )
    ceilings = [int(p) if p < d else m for p, d, m in zip(priced, device, limits)]
    rows = prefix_allocation_naive(forecast, ceilings, active, g.target_capacity)
    return {lane.rid: (c, int(r)) for lane, c, r in zip(order, ceilings, rows)}


@spec(
    "useful-service/score-formula",
    "useful-service/expected-scores",
    "useful-service/prefill-actual-tokens",
    "useful-service/tail-example",
    "prerequisites/terminal-lane-value",
    "speculative-coverage/ceiling-bound",
    "speculative-coverage/prefix-limit-ceilings",
    "speculative-coverage/prices-rank-cohorts",
    "speculative-coverage/querylength-fits-p",
    "mixed-execution/one-prompt-row",
    "useful-service/unknown-optimistic",
)
@pytest.mark.parametrize("catalog, max_requests", _catalogs(6), ids=CATALOG_IDS)
def test_every_candidates_lanes_carry_the_reference_values(catalog, max_requests):
    """Every materialised candidate of random populations, lane by lane, against the naive
    objective of reference/cohorts.py: a lane's work is legal for its program and request, its
    value is the objective's value of that work (decoders at the rows the host gives, or the
    device gives under the lane's ceilings), the useful value is the lanes' sum and the score
    that sum per duration less the common waiting cost (an unmeasured program: the lanes valued
    at T = 0 and the score their sum, the optimistic work score). The crosscheck compares best scores per
    program; this checks that the lanes a plan carries are the ones that earned them."""
    rng = np.random.default_rng(11)
    policy_config = PolicyConfig()
    checked = 0
    for _ in range(40):
        views, inp, obj, mode = _lane_values_case(catalog, rng, max_requests, policy_config)
        by_rid = {v.rid: v for v in views}
        for c in policy.candidates(inp):
            g, lanes = c.graph, c.lanes
            t = inp.costs.estimate_ms(g.key)
            tz = 0.0 if t is None else t
            assert c.duration_ms == t and c.following is None
            assert 1 <= len(lanes) <= g.batch_capacity and len({each.rid for each in lanes}) == len(lanes)
            assert all(by_rid[each.rid].runnable and by_rid[each.rid].slot == each.slot for each in lanes)
            device = g.kind is GraphKind.SPECULATIVE and g.allocation is Allocation.PREFIX_LIMIT
            rows = (
                _device_rows(obj, g, [each for each in lanes if each.role is LaneRole.DECODE], by_rid)
                if device
                else {}
            )
            for lane in lanes:
                v = by_rid[lane.rid]
                if lane.role is LaneRole.PROMPT:
                    cap = g.prefill_capacity if g.kind is GraphKind.MIXED else g.token_capacity
                    n = cohorts.prompt_work_naive(v, cap)
                    assert v.phase is Phase.PREFILL and lane.prompt_tokens == n > 0
                    assert v.needs_scores == (g.kind is GraphKind.SCORED_PREFILL)
                    assert lane.expected_tokens == (1.0 if n == v.prompt_remaining else 0.0)
                    assert lane.value == pytest.approx(obj.prompt_value(v, n), rel=1e-9)
                elif lane.role is LaneRole.DECODE:
                    assert v.phase is Phase.DECODE and g.kind.is_generation
                    limit = cohorts._lane_limit(v, g)
                    if g.steps > 1:  # a K-step lane: all its steps, one delivered burst
                        assert (lane.query_length, lane.ceiling) == (0, limit)
                        assert lane.expected_tokens == limit
                        assert lane.value == pytest.approx(obj.steps_value(v, limit, tz), rel=1e-9)
                        continue
                    if device:
                        ceiling, r = rows[lane.rid]
                        assert (lane.query_length, lane.ceiling) == (0, ceiling)
                    else:
                        r = lane.query_length
                        assert lane.ceiling == 0 and 1 <= r <= limit
                    assert lane.expected_tokens == pytest.approx(_expected(obj, v, r), rel=1e-9)
                    assert lane.value == pytest.approx(obj.decoder_value(v, r, tz), rel=1e-9)
                else:
                    assert lane.role is LaneRole.TERMINAL and v.phase is Phase.TERMINAL
                    assert lane.expected_tokens == 0.0
                    assert lane.value == pytest.approx(obj.terminal_value(v, tz), rel=1e-9)
            if g.kind is GraphKind.MIXED:
                assert sum(each.role is LaneRole.PROMPT for each in lanes) <= 1
            if g.kind is GraphKind.SPECULATIVE and not device:
                assert sum(each.query_length for each in lanes) <= g.target_capacity
            useful = sum(each.value for each in lanes)
            assert c.useful_value == pytest.approx(useful, rel=1e-9, abs=1e-12)
            assert c.score == pytest.approx(obj.rate(useful, t), rel=1e-9, abs=1e-12)
            checked += 1
    assert checked > 200
