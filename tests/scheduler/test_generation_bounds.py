"""Generation rows: dominance signatures of unconstrained and adaptive ragged rows, and the two
upper bounds (``generation.ragged_upper_value``, ``ragged_dual_value``) that let a selection
leave an adaptive ragged program's cohort search out. Each bound is checked against an
exhaustive search over cohorts and extension rows, or against the candidate it must bound."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.policy import generation

from .helpers import RAGGED, SPEC, decoder, geometric, inputs

spec = pytest.mark.spec


def _spec_graph(**shape):
    """SPEC's speculative program of this (B, W, D, P, allocation)."""
    (g,) = [
        g
        for g in SPEC.graphs
        if g.kind is GraphKind.SPECULATIVE and all(getattr(g, k) == v for k, v in shape.items())
    ]
    return g


def _with(catalog, *graphs, replace=()):
    """`catalog` with `graphs` added and each (old, new) of `replace` swapped in."""
    swap = dict(replace)
    return dataclasses.replace(catalog, graphs=tuple(swap.get(g, g) for g in catalog.graphs) + graphs)


@spec("useful-service/dominance-prune", "useful-service/no-padding-preference")
def test_a_wider_rectangular_program_serving_the_same_lanes_never_wins_on_time():
    """Two rectangular programs of one batch and depth (B=2, D=7) and widths W=4 and W=8: lanes
    limited to four rows get the same prefixes from both, so the W=8 row is the W=4 row's work
    with padding. Measured faster, it must still be discarded by dominance, never chosen."""
    wide = _spec_graph(batch_capacity=2, token_capacity=8, proposal_depth=7)
    narrow = dataclasses.replace(wide, token_capacity=4, target_capacity=8)
    fast_wide = dataclasses.replace(wide, duration_ms=1.0)  # timing noise: the padded one is fastest
    catalog = _with(SPEC, narrow, replace=[(wide, fast_wide)])
    views = [decoder(i, survival=geometric(0.9), width_limit=4) for i in range(2)]
    inp = inputs(views, catalog=catalog)
    rows = policy.scored(inp)
    keys = {r.graph.key for r in rows}
    assert narrow.key in keys and fast_wide.key not in keys
    chosen = policy.select(inp)
    assert chosen.graph.key != fast_wide.key
    # Without dominance the padded row would win: the same value in the shortest time.
    sel = policy.Selection(inp)
    (padded,) = [g for g in sel.prepared.generation if g.key == fast_wide.key]
    (same,) = [g for g in sel.prepared.generation if g.key == narrow.key]
    table = sel.decoders.table(4, 7)
    row = generation._unconstrained_candidate(sel, padded, table, False)
    assert row.signature == generation._unconstrained_candidate(sel, same, table, False).signature
    assert row.score > chosen.score


SPEC_DEVICE_MS = _spec_graph(allocation=Allocation.PREFIX_LIMIT).duration_ms


def _device_pair(big_ms: float):
    """SPEC's device ragged program (B=16, W=8, D=7, P=64), measured at `big_ms`, and one of
    B=8, P=48 that dominates it, measured at 1.5x SPEC's time."""
    big = _spec_graph(allocation=Allocation.PREFIX_LIMIT)
    small = dataclasses.replace(big, batch_capacity=8, target_capacity=48, duration_ms=1.5 * big.duration_ms)
    fast_big = dataclasses.replace(big, duration_ms=big_ms)
    return _with(SPEC, small, replace=[(big, fast_big)]), small, fast_big


@spec("useful-service/dominance-prune", "speculative-coverage/prefix-limit-ceilings")
def test_a_device_ragged_row_with_the_same_cohort_and_ceilings_is_dominated():
    """Device lanes' work is their ceiling: eight decoders of equal prices get ceiling W=8 on
    both device programs, so the P=64 row does the P=48 row's work (the device would allocate
    more rows, but the host fixes only the ceilings). Measured much faster, it is still
    discarded and never chosen, though its own score is the best."""
    catalog, small, big = _device_pair(1.0)
    views = [decoder(i, survival=geometric(0.8)) for i in range(8)]
    inp = inputs(views, catalog=catalog)
    rows = {r.graph.key: r for r in policy.scored(inp)}
    assert small.key in rows and big.key not in rows
    chosen = policy.select(inp)
    assert chosen.graph.key != big.key
    sel = policy.Selection(inp)
    (g,) = [h for h in sel.prepared.generation if h.key == big.key]
    row = generation.adaptive_ragged_candidate(sel, g)
    lanes = row.build().lanes
    assert [lane.ceiling for lane in lanes] == [8] * 8 and row.signature == rows[small.key].signature
    assert row.score > chosen.score


@spec("useful-service/dominance-prune")
def test_a_device_ragged_row_serving_more_lanes_than_its_dominator_is_kept():
    """Twelve decoders: the B=8 program serves eight, the B=16 one twelve. Their cohorts differ,
    so dominance compares nothing and the larger program's row stays, with its twelve lanes."""
    catalog, small, big = _device_pair(SPEC_DEVICE_MS)
    views = [decoder(i, survival=geometric(0.8)) for i in range(12)]
    rows = {r.graph.key: r for r in policy.scored(inputs(views, catalog=catalog))}
    assert small.key in rows and big.key in rows
    assert len(rows[big.key].build().lanes) == 12 and len(rows[small.key].build().lanes) == 8


def _bound_parts(sel, g):
    """Pending row values (age terms at g's duration included), the extension rows each lane's
    width admits, B, P: what the bounds are defined over."""
    d = sel.decoders
    t = sel.duration(g)
    pending = d.output_price + d.delivery_value + d.age_value_per_ms * t
    widths = d.table(g.token_capacity, g.proposal_depth).widths
    pool = [float(d.extension_value[i, j]) for i in range(d.count) for j in range(int(widths[i]) - 1)]
    return [float(p) for p in pending], pool, g.batch_capacity, g.target_capacity


def _exhaustive_upper(pending, pool, batch, rows) -> float:
    """The first bound by enumeration: every cohort of 1..min(B, P) lanes with every set of at
    most P - m extension rows from any lane."""
    best = -np.inf
    for m in range(1, min(batch, len(pending), rows) + 1):
        top = max(sum(c) for c in itertools.combinations(pending, m))
        extra = max(
            sum(r) for j in range(min(rows - m, len(pool)) + 1) for r in itertools.combinations(pool, j)
        )
        best = max(best, top + extra)
    return best


def _selection(views, catalog):
    return policy.Selection(inputs(views, catalog=catalog))


def _host_ragged_b4_p4():
    """RAGGED with a host ragged program of P = B = 4 (W=4, D=3): a cohort of four lanes
    leaves no extension row."""
    (g,) = [g for g in RAGGED.graphs if g.target_capacity == 6]
    return _with(RAGGED, dataclasses.replace(g, target_capacity=4, duration_ms=4.3))


UPPER_CASES = {
    # more decoders than B (4); six extension rows, P - m from 5 down to 2
    "host P=6": (RAGGED, 6, [dict(width_limit=w) for w in (2, 3, 1, 2, 1, 3)]),
    # m = P = 4: the best is four pending rows and no extension row
    "host P=B": (_host_ragged_b4_p4(), 4, [dict(width_limit=w, z=1.0, age_ms=60.0) for w in (2, 3, 2, 1, 3)]),
    # a few long lanes: the P - m rows come from several lanes at different depths
    "device P=8": (RAGGED, 8, [dict(width_limit=w) for w in (4, 1, 1, 3, 2)]),
    # two lanes, one extension row: P - m exceeds the rows there are
    "device, one row": (RAGGED, 8, [dict(width_limit=2), dict(width_limit=1)]),
}


@pytest.mark.parametrize("case", sorted(UPPER_CASES))
def test_ragged_upper_value_is_the_best_cohort_with_free_extension_rows(case):
    """ragged_upper_value is, exactly, the best over cohorts of m <= min(B, decoders, P) lanes
    of their pending rows plus at most P - m extension rows taken from any lane within its
    width (the prefix and same-lane constraints dropped), by enumeration."""
    catalog, p, kws = UPPER_CASES[case]
    rng = np.random.default_rng(5)
    views = [
        decoder(
            i,
            survival=geometric(float(rng.uniform(0.3, 0.95)), 3),
            x=float(rng.choice([0.5, 2.0, 8.0])),
            **{"age_ms": float(rng.uniform(0, 40)), **kw},
        )
        for i, kw in enumerate(kws)
    ]
    sel = _selection(views, catalog)
    (g,) = [h for h in sel.prepared.generation if h.target_capacity == p and not h.is_rectangular]
    expected = _exhaustive_upper(*_bound_parts(sel, g))
    assert generation.ragged_upper_value(sel, g) == pytest.approx(expected, rel=1e-12)


def _ragged_programs(sel):
    return [g for g in sel.prepared.generation if g.steps == 1 and generation.boundable(sel, g)]


@pytest.mark.parametrize("catalog", [SPEC, RAGGED], ids=["spec", "ragged"])
def test_both_bounds_hold_with_a_single_extension_row(catalog):
    """One lane may take one extension row, every other lane only its pending row: each adaptive
    ragged candidate earns that row, and both bounds still reach its useful value (age terms
    included); the bounded selection rows then choose what every row would."""
    views = [decoder(0, survival=geometric(0.9), width_limit=2, z=0.05)]
    views += [decoder(i, survival=geometric(0.9), width_limit=1, z=1.0) for i in range(1, 4)]
    inp = inputs(views, catalog=catalog)
    sel = policy.Selection(inp)
    assert _ragged_programs(sel)
    for g in _ragged_programs(sel):
        row = generation.adaptive_ragged_candidate(sel, g)
        built = row.build()
        assert max(lane.expected_tokens for lane in built.lanes) > 1.0  # the extension row is taken
        for bound in (generation.ragged_upper_value(sel, g), generation.ragged_dual_value(sel, g)):
            assert built.useful_value <= bound + 1e-12 * max(1.0, abs(bound))
    _, rows = policy.selection_rows(inp)
    assert policy.select(inp, rows=rows) == policy.select(inp)


def _exhaustive_full_lanes(sel, g) -> float:
    """The best cohort of 1..min(B, P) lanes, each lane at its full width (pending row plus every
    extension row it admits), by enumeration."""
    pending, _, batch, rows = _bound_parts(sel, g)
    d = sel.decoders
    widths = d.table(g.token_capacity, g.proposal_depth).widths
    full = [pending[i] + float(d.extension_value[i, : int(widths[i]) - 1].sum()) for i in range(d.count)]
    return max(
        sum(c) for m in range(1, min(batch, len(full), rows) + 1) for c in itertools.combinations(full, m)
    )


def test_the_dual_bound_at_row_price_zero_prices_every_lane_at_its_full_width():
    """With no row price but 0 (multipliers=0), ragged_dual_value is the best cohort of m lanes
    earning every extension row within their widths; each further price can only lower it."""
    views = [
        decoder(i, survival=geometric(p, 3), width_limit=w, age_ms=5.0 * i)
        for i, (p, w) in enumerate([(0.9, 4), (0.5, 3), (0.8, 1), (0.3, 4), (0.7, 2), (0.95, 2)])
    ]
    sel = _selection(views, RAGGED)
    assert _ragged_programs(sel)
    for g in _ragged_programs(sel):
        at_zero = generation.ragged_dual_value(sel, g, multipliers=0)
        assert at_zero == pytest.approx(_exhaustive_full_lanes(sel, g), rel=1e-12)
        assert generation.ragged_dual_value(sel, g) <= at_zero
