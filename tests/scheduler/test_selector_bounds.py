"""The selector's exact pruning shortcuts (policy/selector.py): an adaptive ragged program
(``_below``) or the whole mixed family (``_mixed_below``) is left out of ``bounded_rows`` only
when its upper bounds score below the floor by more than the margin REL_TIE * (2 * max(1,
|floor|) + |value| / T + T / 2 * |waiting|): two tie tolerances and the rounding allowance of
the bound's sums. A row tied with the floor (``utility.nearly_equal``) is never left out,
whatever the floor (exactness needs one tolerance); the brackets below pin the tie part of the
margin between 1.5 and 2.5 tolerances, so that the shortcut also fires where it should."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import Allocation, GraphKind
from helios_jax.scheduler import policy, utility
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import generation, mixed, selector

from .helpers import POLICY, SPEC, decoder, geometric, inputs, measured, prompt
from .test_plan_cost_bounds import LAZY_CATALOGS, _key, _population, _ragged

# (decoders, duration scale, decode age price, age step ms): a floor below one (max(1, |floor|)
# = 1); many fresh decoders on long programs (the waiting term T / 2 * waiting most of the
# value per ms); programs under a millisecond (T < 1) with scores in the hundreds; SPEC as
# measured.
SCENARIOS = [(5, 10.0, 0.1, 5.0), (60, 10.0, 0.2, 0.0), (30, 0.01, 0.1, 5.0), (30, 1.0, 0.1, 5.0)]


def _selection(decoders: int, scale: float, age_price: float, age_step: float) -> policy.Selection:
    """SPEC's adaptive programs measured at `scale` times their catalog durations, `decoders`
    decoders aged `age_step` ms apart and two prompts (every mixed shape offers rows)."""
    config = dataclasses.replace(POLICY, decode_age_price=age_price)
    views = [
        decoder(i, survival=geometric(0.6 + 0.005 * i), age_ms=age_step * i, policy_config=config)
        for i in range(decoders)
    ]
    views += [prompt(100, 1000, policy_config=config), prompt(101, 40, x=8.0, policy_config=config)]
    costs = CostModel(POLICY.estimate_ttl_ns)
    for g in SPEC.graphs:
        costs.observe(g.key, [g.duration_ms * 1e6 * scale], 0)
    return policy.Selection(inputs(views, costs=costs, policy_config=config))


def _floor(rates, magnitudes, tolerances: float, pick) -> float:
    """The floor `tolerances` tie tolerances (and the magnitude's rounding allowance) above the
    bound `pick` selects (min: the lowest bound's, for either-bound ragged programs; max: the
    highest shape's, for the mixed family)."""
    scale = max(1.0, abs(pick(rates)))
    return float(pick(np.asarray(rates) + utility.REL_TIE * (tolerances * scale + np.asarray(magnitudes))))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_ragged_program_is_left_out_only_past_two_tie_tolerances_and_its_rounding(scenario):
    """``_below`` against each of the program's two bounds (``ragged_upper_value``,
    ``ragged_dual_value``): a floor 1.5 tolerances plus the bound's rounding allowance above the
    lower bound's score keeps the program (its cohort is searched: a row there may tie the best);
    2.5 tolerances plus the allowance leaves it out (the margin is no wider); an infinite floor
    (an indeterminate row) leaves out every determinate row, minus infinity none."""
    sel = _selection(*scenario)
    (g,) = _ragged(sel)
    assert generation.boundable(sel, g)
    t, waiting = sel.duration(g), sel.decision.waiting
    values = [generation.ragged_upper_value(sel, g), generation.ragged_dual_value(sel, g)]
    rates = [sel.decision.rate(v, t) for v in values]
    magnitudes = [abs(v) / t + 0.5 * t * abs(waiting) for v in values]
    assert not selector._below(sel, g, _floor(rates, magnitudes, 1.5, min))
    assert selector._below(sel, g, _floor(rates, magnitudes, 2.5, min))
    assert selector._below(sel, g, float("inf")) and not selector._below(sel, g, -float("inf"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_mixed_family_is_left_out_only_past_two_tie_tolerances_and_its_rounding(scenario):
    """``_mixed_below`` over every shape's bound (``mixed.mixed_upper_rates``, exact where a shape
    offers both its candidates): a floor 1.5 tolerances plus the rounding allowance above the
    highest shape's bound keeps the family; 2.5 above every shape's leaves it out; an infinite
    floor leaves it out, minus infinity keeps it."""
    sel = _selection(*scenario)
    rates, magnitudes = mixed.mixed_upper_rates(sel)
    assert len(rates) > 1 and selector._mixed_boundable(sel, fresh=True)
    assert not selector._mixed_below(sel, _floor(rates, magnitudes, 1.5, np.max))
    assert selector._mixed_below(sel, _floor(rates, magnitudes, 2.5, np.max))
    assert selector._mixed_below(sel, float("inf")) and not selector._mixed_below(sel, -float("inf"))


def test_the_scenarios_reach_each_part_of_the_margin():
    """The scenarios above tell the margin's parts apart: a floor below one and floors above 1.6
    (max(1, |floor|) read, not a constant), a waiting term above half the score, waiting below
    one and durations above and below a millisecond (T / 2 * |waiting| and |value| / T as
    written), for the ragged program and the mixed family alike."""
    seen = collections.Counter()
    for scenario in SCENARIOS:
        sel = _selection(*scenario)
        (g,) = _ragged(sel)
        t, waiting = sel.duration(g), sel.decision.waiting
        score = sel.decision.rate(generation.ragged_upper_value(sel, g), t)
        top = float(np.max(mixed.mixed_upper_rates(sel)[0]))
        for part, floor in (("ragged", score), ("mixed", top)):
            seen[part, "floor below one"] += abs(floor) < 1.0
            seen[part, "floor above 1.6"] += abs(floor) > 1.6
        seen["waiting above half"] += 0.5 * t * waiting > 0.5 * max(1.0, abs(score))
        seen["T above 1 ms"] += t > 1.0
        seen["T below 1 ms"] += t < 1.0
        seen["waiting below 1"] += 0 < waiting < 1.0
    assert len(seen) == 8 and all(seen.values()), seen


def _mixed_rows(rows) -> list:
    return [r for r in rows if r.graph.kind is GraphKind.MIXED]


def _above_every_mixed_bound(sel: policy.Selection) -> float:
    """A floor above every mixed shape's bound and its rounding allowance."""
    rates, magnitudes = mixed.mixed_upper_rates(sel)
    return float(np.max(rates + magnitudes)) + 1.0


def _check_left_out(full, rows, floor, sel) -> collections.Counter:
    """`rows` are `full`'s in order; each row left out is an adaptive ragged or mixed row scored
    below `floor` by more than the tie tolerance. Returns the kinds left out."""
    kept = [_key(r) for r in rows]
    assert kept == [k for k in map(_key, full) if k in set(kept)]
    ragged = {id(g) for g in _ragged(sel)}
    left = collections.Counter()
    for r in (r for r in full if _key(r) not in set(kept)):
        assert id(r.graph) in ragged or r.graph.kind is GraphKind.MIXED, r.graph.name
        assert not r.indeterminate and r.score < floor and not utility.nearly_equal(r.score, floor)
        left["mixed" if r.graph.kind is GraphKind.MIXED else "ragged"] += 1
    return left


@pytest.mark.parametrize("name", sorted(LAZY_CATALOGS))
def test_a_row_tied_with_the_floor_is_never_left_out(name):
    """``bounded_rows``' exactness under any floor (``floor_of`` a constant): its rows are
    ``scored``'s in order less adaptive ragged and mixed rows each below the floor by more than
    the tie tolerance. The floors are each ragged row's score and the best mixed row's, and one
    just under a tie tolerance above it (``nearly_equal``: a tie ``select`` compares in full),
    which keep that row; both shortcuts leave rows out across the draws."""
    rng, left = np.random.default_rng(29), collections.Counter()
    for _ in range(30):
        inp = inputs(_population(rng), catalog=LAZY_CATALOGS[name])
        sel = policy.Selection(inp)
        full = policy.scored(inp, sel)
        ragged = {id(g) for g in _ragged(sel)}
        determinate = [r for r in full if not r.indeterminate]
        targets = [r for r in determinate if id(r.graph) in ragged]
        targets += sorted(_mixed_rows(determinate), key=lambda r: r.score)[-1:]  # the best mixed row
        for r in targets:
            for floor in (r.score, r.score + 0.99 * utility.REL_TIE * max(1.0, abs(r.score))):
                assert utility.nearly_equal(r.score, floor)
                rows = policy.bounded_rows(sel, lambda _, f=floor: f, fresh=False)
                assert _key(r) in {_key(k) for k in rows}, (r.graph.name, r.score, floor)
                left += _check_left_out(full, rows, floor, sel)
    assert left["ragged"] and left["mixed"], left


@pytest.mark.parametrize("who", ["decoders", "prompts"])
def test_the_mixed_family_waits_for_the_floor_with_decoders_or_prompts_alone(who):
    """The mixed family offers rows with decoders alone (decode-only cohorts) and with prompts
    alone (prompt-only rows): either way, measured and fresh, it waits for the floor, so a floor
    above every shape's bound leaves all its rows out, and a floor below every row keeps
    ``scored``'s rows."""
    views = [decoder(i, survival=geometric(0.7)) for i in range(6)] if who == "decoders" else []
    views += [prompt(20, 1000), prompt(21, 40, x=8.0)] if who == "prompts" else []
    inp = inputs(views)
    sel = policy.Selection(inp)
    full = policy.scored(inp, sel)
    assert _mixed_rows(full) and bool(sel.decoders.count) != bool(sel.prompts.count)
    above = _above_every_mixed_bound(sel)
    assert not _mixed_rows(policy.bounded_rows(sel, lambda _: above, fresh=True))
    below = min(r.score for r in full) - 1.0
    assert [_key(r) for r in policy.bounded_rows(sel, lambda _: below, fresh=True)] == list(map(_key, full))


def test_stale_mixed_programs_wait_for_the_floor_only_where_stale_rows_are_not_read():
    """Every estimate stale: ``bounded_rows`` as ``selection_rows`` calls it (``fresh``: a
    refresh alternative reads stale rows whatever their score) keeps the mixed rows under any
    floor, while the fixed-floor form a probe reads (``rows_with_ragged_programs``, ``fresh``
    False) leaves the family out below the floor as with fresh estimates."""
    stale_ns = 10 * POLICY.estimate_ttl_ns  # past the freshness interval `measured` uses
    views = [decoder(i, survival=geometric(0.7)) for i in range(6)] + [prompt(20, 1000)]
    inp = inputs(views, costs=measured(SPEC), now_ns=stale_ns)
    sel = policy.Selection(inp)
    assert all(sel.is_stale(g) for g in sel.prepared.mixed)
    above = _above_every_mixed_bound(sel)
    full = policy.scored(inp, sel)
    kept = policy.bounded_rows(sel, lambda _: above, fresh=True)
    assert _mixed_rows(kept) and list(map(_key, _mixed_rows(kept))) == list(map(_key, _mixed_rows(full)))
    assert not _mixed_rows(policy.bounded_rows(sel, lambda _: above, fresh=False))
    entries, _ = policy.rows_with_ragged_programs(sel, above)
    assert not _mixed_rows(e for e in entries if isinstance(e, policy.ScoredCandidate))


def test_unmeasured_mixed_rows_are_built_before_the_floor_they_set():
    """Mixed programs unmeasured (every other program measured): their rows are indeterminate,
    built before the floor (no bound to wait on), and outrank every determinate row, so
    ``selection_rows`` searches no adaptive ragged program's cohort, not even the best
    determinate row's (SPEC's device ragged program as its only generation program)."""
    graphs = [
        g
        for g in SPEC.graphs
        if g.kind is not GraphKind.SPECULATIVE or g.allocation is Allocation.PREFIX_LIMIT
    ]
    catalog = dataclasses.replace(SPEC, graphs=tuple(graphs))
    costs = CostModel(POLICY.estimate_ttl_ns)
    for g in catalog.graphs:
        if g.kind is not GraphKind.MIXED:
            costs.observe(g.key, [g.duration_ms * 1e6], 0)
    views = [decoder(i, survival=geometric(0.9), age_ms=5.0 * i) for i in range(16)] + [prompt(20, 1000)]
    inp = inputs(views, catalog=catalog, costs=costs)
    sel, rows = policy.selection_rows(inp)
    full = policy.scored(inp)
    assert mixed.mixed_upper_rates(sel) is None and all(r.indeterminate for r in _mixed_rows(full))
    (g,) = _ragged(sel)
    assert generation.boundable(sel, g)
    assert max((r for r in full if not r.indeterminate), key=lambda r: r.score).graph is g
    assert [_key(r) for r in rows] == [_key(r) for r in full if r.graph is not g]


def test_scored_and_select_read_the_selection_and_rows_they_are_handed(monkeypatch):
    """A caller that built ``Selection(inp)`` or its rows already (``Scheduler._plan`` hands
    ``select`` the rows of ``selection_rows``) is not made to build them again: with the
    selection handed, ``scored`` and ``select`` build no other; with the rows handed, ``select``
    scores nothing, and chooses as over ``scored``'s rows."""
    views = [decoder(i, survival=geometric(0.7)) for i in range(6)] + [prompt(20, 1000)]
    inp = inputs(views)
    sel, rows = policy.selection_rows(inp)
    expected = policy.select(inp)
    listed = [_key(r) for r in policy.scored(inp)]

    def refuse(*args, **kwargs):
        raise AssertionError("built again")

    with monkeypatch.context() as m:
        m.setattr(selector, "Selection", refuse)
        assert [_key(r) for r in policy.scored(inp, sel)] == listed
        assert policy.select(inp, sel) == expected
    with monkeypatch.context() as m:
        m.setattr(selector, "scored", refuse)
        assert policy.select(inp, rows=rows) == expected
