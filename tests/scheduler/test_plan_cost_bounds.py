"""Cheap decisions (issue 14), fifth round: an adaptive ragged program's cohort is searched only
when an upper bound on its score could matter. Each test fails when the bound is wrong or the
shortcut is dropped or widened."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import Allocation, DecodeMode, GraphKind
from helios_jax.scheduler import learning, policy, utility
from helios_jax.scheduler.policy import generation, prepared, ranking, selector

from .helpers import RAGGED, SPEC, decoder, geometric, inputs, measured, prompt

CATALOGS = {"spec": SPEC, "ragged": RAGGED}


def _two_ragged():
    """SPEC with two more device ragged programs: B=8 P=48, which dominates SPEC's B=16 W=8 P=64
    (its row drops that one's when they serve the same lanes), and B=8 W=16 D=15 P=64, which
    dominates none; with SPEC's, two adaptive ragged programs are left to their bounds."""
    (g,) = [g for g in SPEC.graphs if g.allocation is Allocation.PREFIX_LIMIT and g.token_capacity == 8]
    extra = (
        dataclasses.replace(g, batch_capacity=8, target_capacity=48, duration_ms=0.8 * g.duration_ms),
        dataclasses.replace(
            g, batch_capacity=8, token_capacity=16, proposal_depth=15, duration_ms=1.1 * g.duration_ms
        ),
    )
    return dataclasses.replace(SPEC, graphs=SPEC.graphs + extra)


LAZY_CATALOGS = {**CATALOGS, "two ragged": _two_ragged()}


def _population(rng: np.random.Generator, prompts: bool = True) -> list:
    """Decoders of random prices, ages, acceptance, output and width limits; some prompts."""
    views = []
    for rid in range(int(rng.integers(1, 40))):
        kw = {"last_selected_ns": int(rng.choice([-1, 3, 7]))}
        if rng.random() < 0.2:
            kw["width_limit"] = int(rng.integers(1, 5))
        views.append(
            decoder(
                rid,
                x=float(rng.choice([0.5, 1.0, 2.0, 8.0])),
                z=float(rng.choice([0.05, 0.25, 1.0])),
                age_ms=float(rng.uniform(0.0, 80.0)),
                survival=geometric(float(rng.uniform(0.1, 0.95))),
                output_remaining=int(rng.choice([1, 2, 3, 9, 1000])),
                **kw,
            )
        )
    if prompts:
        n = len(views)
        views += [prompt(n + i, int(rng.choice([40, 700]))) for i in range(int(rng.integers(0, 3)))]
    return views


def _ragged(sel: policy.Selection) -> list:
    return [g for g in sel.prepared.generation if g.steps == 1 and not prepared.is_unconstrained(g)]


def _key(r: policy.ScoredCandidate) -> tuple:
    return (id(r.graph), r.score, r.duration_ms, r.signature)


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_ragged_upper_value_bounds_every_adaptive_ragged_candidate(name):
    """The bound is at least the built candidate's useful value (age terms included), host and
    device allocation alike, up to its sums' rounding."""
    rng, checked = np.random.default_rng(3), 0
    for _ in range(60):
        sel = policy.Selection(inputs(_population(rng, prompts=False), catalog=CATALOGS[name]))
        for g in _ragged(sel):
            row = generation.adaptive_ragged_candidate(sel, g)
            if row is None:
                continue
            value = row.build().useful_value
            for bound in (generation.ragged_upper_value(sel, g), generation.ragged_dual_value(sel, g)):
                assert value <= bound + 1e-12 * max(1.0, abs(bound)), (g.key, value, bound)
            checked += 1
    assert checked >= 60


def _bounded_against_full(views, **kw) -> set:
    """selection_rows' rows are scored()'s, in order, less adaptive ragged and mixed rows that
    score below the best by more than the tie tolerance; select() chooses the same. Returns
    the kinds of row left out ('ragged', 'mixed')."""
    inp = inputs(views, **kw)
    sel, rows = policy.selection_rows(inp)
    full = policy.scored(inp, policy.Selection(inp))
    kept = [_key(r) for r in rows]
    assert kept == [k for k in map(_key, full) if k in set(kept)]
    left = [r for r in full if _key(r) not in set(kept)]
    determinate = [r.score for r in full if not r.indeterminate]
    for r in left:
        assert (r.graph in _ragged(sel) or r.graph.kind is GraphKind.MIXED) and not r.indeterminate
        assert r.score < max(determinate) and not utility.nearly_equal(r.score, max(determinate))
    assert policy.select(inp, rows=rows) == policy.select(inp, rows=full)
    return {"mixed" if r.graph.kind is GraphKind.MIXED else "ragged" for r in left}


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_selection_rows_leave_out_only_rows_that_cannot_be_chosen(name):
    rng, left = np.random.default_rng(11), set()
    for _ in range(80):
        left |= _bounded_against_full(_population(rng), catalog=CATALOGS[name])
    assert left == {"ragged", "mixed"}  # both shortcuts are taken


def test_stale_ragged_programs_keep_their_rows():
    """A stale program's row can be a timing-refresh alternative whatever its score: it is never
    left out of selection_rows."""
    rng = np.random.default_rng(11)
    stale_ns = 10 * 30_000_000_000  # every estimate past PolicyConfig's freshness interval
    for _ in range(40):
        views = _population(rng)
        inp = inputs(views, catalog=SPEC, costs=measured(SPEC), now_ns=stale_ns)
        _, rows = policy.selection_rows(inp)
        assert [_key(r) for r in rows] == [_key(r) for r in policy.scored(inp)]


def test_a_ragged_program_that_dominates_another_is_always_scored():
    """RAGGED's host ragged program (4, 4, P=6) dominates its device one (4, 4, P=8): leaving it
    out could keep the device row that it would have dropped, so it is never deferred."""
    sel = policy.Selection(inputs([decoder(i, survival=geometric(0.8)) for i in range(6)], catalog=RAGGED))
    ragged = {g.target_capacity: g for g in _ragged(sel)}
    assert not generation.boundable(sel, ragged[6]) and generation.boundable(sel, ragged[8])
    deferred: generation.Deferred = []
    generation.generation_candidates(sel, deferred)
    assert [g for _, g in deferred] == [ragged[8]]


@pytest.mark.spec("acceptance-learning/rank-gain-rate", "acceptance-learning/tie-order")
@pytest.mark.parametrize("name", sorted(LAZY_CATALOGS))
def test_probe_with_bounded_rows_equals_the_probe_over_every_row(monkeypatch, name):
    """An acceptance probe searches a drafted ragged program's cohort only when its bounds can
    beat the ordinary winner and displace the best probe found before it in the rows' order;
    the probe chosen is the same as with every row scored, and both shortcuts are taken."""
    rng, compared = np.random.default_rng(5), 0
    left = collections.Counter()
    real = selector._ragged_row

    def counting(sel, g, floor, fresh):
        row = real(sel, g, floor, fresh)
        if row is None and generation.adaptive_ragged_candidate(sel, g) is not None:
            below_ordinary = selector._below(sel, g, ordinary.score)
            left["below the ordinary winner" if below_ordinary else "below the best probe"] += 1
        return row

    for _ in range(60):
        views = _population(rng, prompts=False)
        inp = inputs(views, catalog=LAZY_CATALOGS[name])
        ordinary = policy.select(inp)
        if ordinary is None or ordinary.indeterminate:
            continue
        optimistic = [dataclasses.replace(v, survival=np.minimum(1.0, v.survival + 0.3)) for v in views]
        info = lambda rid, a, b: 1.0  # noqa: E731  (every added depth equally informed)
        with monkeypatch.context() as m:
            m.setattr(selector, "_ragged_row", counting)
            bounded = learning.probe(inp, ordinary, optimistic, info)
        with monkeypatch.context() as m:
            every = lambda sel, floor: (policy.scored(sel.inp, sel), None)  # noqa: E731
            m.setattr(policy, "rows_with_ragged_programs", every)
            full = learning.probe(inp, ordinary, optimistic, info)
        assert bounded == full
        compared += 1
    assert compared > 20 and left["below the ordinary winner"]
    if name == "spec":  # RAGGED's probes find no probe before its ragged rows
        assert left["below the best probe"], left


@pytest.mark.parametrize("name", sorted(LAZY_CATALOGS))
def test_rows_with_ragged_programs_built_at_their_floor_are_the_bounded_rows(name):
    """Each adaptive ragged program left in place, built against the same fixed floor, gives
    ``bounded_rows``' list with stale programs as left out as fresh ones: the same rows in the
    same order (prompts, mixed rows and blocked prompts' sequences present; every estimate fresh,
    and every one stale)."""
    from .test_plan_cost_sequences import _population as with_prerequisites

    rng, programs, stale_ns = np.random.default_rng(13), 0, 10 * 30_000_000_000
    catalog = LAZY_CATALOGS[name]
    for k in range(80):
        views = _population(rng) if k % 2 else with_prerequisites(rng)
        inp = inputs(views, catalog=catalog, costs=measured(catalog), now_ns=stale_ns * (k % 4 > 1))
        sel = policy.Selection(inp)
        scores = [r.score for r in policy.scored(inp, sel) if not r.indeterminate]
        for floor in [min(scores, default=0.0), float(np.median(scores)) if scores else 0.0]:
            entries, build = policy.rows_with_ragged_programs(sel, floor)
            programs += sum(1 for e in entries if not isinstance(e, policy.ScoredCandidate))
            rows = [build(e, floor) if not isinstance(e, policy.ScoredCandidate) else e for e in entries]
            expected = policy.bounded_rows(sel, lambda _, f=floor: f, fresh=False)
            assert [_key(r) for r in rows if r is not None] == [_key(r) for r in expected]
    assert programs > 20


@pytest.mark.spec("useful-service/dominance-prune")
@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_a_row_is_dominated_when_the_filter_would_drop_it(name):
    """``ranking.dominated`` (a ragged row built after the others were filtered) answers what
    ``prune_dominated`` does with the row among them, on random groups of the catalog's programs."""
    rng, drops = np.random.default_rng(7), collections.Counter()
    prep = policy.as_prepared(inputs([decoder(0)], catalog=CATALOGS[name]).graphs)
    graphs = list(prep.graphs)

    def row(g):
        sig = int(rng.integers(0, 3)) if rng.random() < 0.9 else None
        return policy.ScoredCandidate(g, 1.0, 1.0, sig, lambda: None)

    for _ in range(400):
        others = [row(graphs[int(i)]) for i in rng.integers(0, len(graphs), size=int(rng.integers(0, 12)))]
        r = row(graphs[int(rng.integers(0, len(graphs)))])
        dropped = r not in ranking.prune_dominated(others + [r], prep)
        assert ranking.dominated(r, others, prep) == dropped
        drops[dropped] += 1
    assert drops[True] and drops[False], drops


@pytest.mark.spec("acceptance-learning/tie-order")
@pytest.mark.parametrize("gain", [0.5, 3.0, 250.0])
def test_a_probe_row_is_left_to_its_bound_only_below_the_best_gain_beyond_the_tie_tolerance(gain):
    """The floor a row of duration T must reach to displace the best probe (gain per ms `gain`):
    a row of equal gain, or one within the tie tolerance below it, is at or above the floor (its
    cohort is searched: a tie may still win on information, duration or geometry); a row whose
    gain is clearly lower is below it. Before any probe, the floor is the ordinary winner's score."""
    score, t = 10.0, 4.0
    floor = learning._floor_to_displace(score, (gain, -1.0, -t, (-1,)), t)
    tolerance = utility.REL_TIE * max(1.0, gain)
    for tied in (gain, gain - 0.5 * tolerance, gain - 0.99 * tolerance):
        assert score + t * tied >= floor, tied
        assert utility.nearly_equal(tied, gain)
    assert score + t * (gain - 2.5 * tolerance) < floor  # a margin of two tolerances, not more
    assert score + t * gain * (1 - 1e-6) < floor
    assert learning._floor_to_displace(score, None, t) == score


def test_every_ragged_row_is_scored_by_candidates_and_scored():
    """The explicit listings (``policy.candidates``, ``policy.scored``) keep every row."""
    rng = np.random.default_rng(2)
    for _ in range(20):
        inp = inputs(_population(rng, prompts=False), catalog=SPEC)
        sel = policy.Selection(inp)
        kinds = [c.graph for c in policy.candidates(inp) if c.kind is GraphKind.SPECULATIVE]
        assert all(g in kinds for g in _ragged(sel) if generation.adaptive_ragged_candidate(sel, g))


def test_a_row_is_left_out_only_below_the_floor_beyond_the_tie_tolerance():
    """At a floor equal to the bound's score, or within the tie tolerance above it, the row is
    searched; a floor clearly above leaves it out."""
    sel = policy.Selection(inputs([decoder(i, survival=geometric(0.7)) for i in range(20)], catalog=SPEC))
    (g,) = _ragged(sel)
    t = sel.duration(g)
    value = min(generation.ragged_upper_value(sel, g), generation.ragged_dual_value(sel, g))
    score = sel.decision.rate(value, t)
    tolerance = utility.REL_TIE * max(1.0, abs(score))
    assert not selector._below(sel, g, score)
    assert not selector._below(sel, g, score + 0.5 * tolerance)
    assert selector._below(sel, g, score + 1e-6 * max(1.0, abs(score)))
    assert selector._below(sel, g, float("inf")) and not selector._below(sel, g, float("-inf"))


def test_families_without_programs_do_no_work(monkeypatch):
    """A probe's selection holds only drafted programs: with prompts and terminal rows present,
    the prefill, mixed and snapshot families return nothing without building a row."""
    from helios_jax.scheduler.policy import mixed, prefill, snapshots, tables
    from helios_jax.scheduler.view import Phase, RequestView

    def refuse(*args, **kwargs):
        raise AssertionError("built rows for no program")

    terminal = RequestView(rid=90, slot=90, phase=Phase.TERMINAL, log_prefill_price=0.0, log_output_price=0.0)
    views = [decoder(i) for i in range(3)] + [prompt(10, 700), terminal]
    drafted = policy.as_prepared(inputs(views).graphs).drafted()
    sel = policy.Selection(dataclasses.replace(inputs(views), graphs=drafted))
    assert sel.prompts.count and sel.terminals
    monkeypatch.setattr(tables.PromptTable, "rows_at", refuse)
    monkeypatch.setattr(mixed, "MixedFamily", refuse)
    monkeypatch.setattr(snapshots.np, "lexsort", refuse)
    assert prefill.prefill_candidates(sel) == []
    assert mixed.mixed_candidates(sel) == []
    assert snapshots.terminal_candidates(sel) == []


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_the_dual_bound_leaves_out_rows_the_first_bound_cannot(monkeypatch, name):
    """With the floor just above a ragged row's own score, the dual bound (extension rows kept
    within the cohort's lanes) leaves the row out where the first bound alone would not."""
    rng, both, first_only = np.random.default_rng(17), 0, 0
    for _ in range(40):
        sel = policy.Selection(inputs(_population(rng, prompts=False), catalog=CATALOGS[name]))
        for g in _ragged(sel):
            row = generation.adaptive_ragged_candidate(sel, g) if generation.boundable(sel, g) else None
            if row is None:
                continue
            floor = row.score + 1e-3 * max(1.0, abs(row.score))
            both += selector._below(sel, g, floor)
            with monkeypatch.context() as m:
                m.setattr(selector, "ragged_dual_value", lambda sel, g: np.inf)
                first_only += selector._below(sel, g, floor)
    assert both > first_only


def _constructed_alike(obj) -> bool:
    """`obj` has every field of its dataclass and equals what the constructor makes of them."""
    cls = type(obj)
    return obj.__dict__.keys() == {f.name for f in dataclasses.fields(cls)} and obj == cls(**obj.__dict__)


def test_the_decision_scale_is_the_largest_finite_log_price_and_zero():
    """``Decision.build``'s shared scale: the largest finite log price of the decision's views,
    and 0 (so a decision whose prices are all below one is not scaled)."""
    from helios_jax.scheduler.config import PolicyConfig

    def scale(*prices):
        views = [
            dataclasses.replace(
                decoder(i), log_prefill_price=p, log_output_price=p - 1.0, log_delivery_price=-np.inf
            )
            for i, p in enumerate(prices)
        ]
        return utility.Decision.build(views, PolicyConfig(), sigma_decode=1.0, sigma_terminal=1.0).log_scale

    assert scale(-0.5, -2.0) == 0.0
    assert scale(0.25, 0.75, np.inf) == 0.75
    assert scale(0.5, 0.5) == 0.5


def test_lanes_built_without_the_constructor_equal_constructed_ones():
    """Plans and plan lanes (``frames``), decode lanes (``DecoderTable.lanes``), materialised
    candidates (``Selection._materialise``) and decisions (``Decision.build``) set every field
    of their dataclass directly: the same objects the constructors make, no field missing (a
    field added later must be set there too)."""
    from .test_core import run_once, scheduler

    s = scheduler(SPEC, mode=DecodeMode.ADAPTIVE)
    for n in (8, 60, 200):
        s.admit([1] * n, max_output=50)
    seen: set = set()
    t = 0.0
    for fence in range(1, 12):
        plan = s.plan()
        assert _constructed_alike(plan)
        for lane in plan.lanes:
            assert _constructed_alike(lane)
            seen.add(lane.role)
        _, _, t = run_once(s, fence, t, accepted=fence % 3)
    assert len(seen) >= 2
    sel, rows = policy.selection_rows(inputs([decoder(i, survival=geometric(0.6)) for i in range(3)]))
    assert rows and all(_constructed_alike(r.build()) for r in rows)
    assert _constructed_alike(sel.decision)
    sel = policy.Selection(inputs([decoder(i, survival=geometric(0.6)) for i in range(5)]))
    rows, ceilings = np.array([1, 2, 3, 4, 2]), np.array([2, 3, 3, 4, 5])
    for lanes in (
        sel.decoders.lanes(range(5), rows, 3.0),
        sel.decoders.lanes(range(5), rows, 3.0, ceilings=ceilings),
    ):
        for lane in lanes:
            assert _constructed_alike(lane)


def test_a_view_with_other_survival_copies_every_field():
    from helios_jax.scheduler.view import RequestView

    v = decoder(3, survival=geometric(0.5), optimistic=geometric(0.7))
    w = v.with_survival(v.optimistic)
    assert w.survival is v.optimistic and v.survival is not w.survival
    assert dataclasses.replace(v, survival=v.optimistic).__dict__.keys() == w.__dict__.keys()
    assert all(
        getattr(w, f.name) is getattr(v, f.name)
        for f in dataclasses.fields(RequestView)
        if f.name != "survival"
    )
    w.__dict__["age_ms"] = 99.0  # its own dict
    assert v.age_ms != 99.0


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_mixed_upper_rates_bound_every_mixed_row(name):
    """Each mixed shape's bound is at least the scores of its prompt-row and decode-only rows,
    prompts with and without decoders beside them."""
    from helios_jax.scheduler.policy import mixed

    rng, checked = np.random.default_rng(23), 0
    for trial in range(60):
        views = (
            _population(rng) if trial % 3 else [prompt(i, int(rng.choice([40, 700, 5000]))) for i in range(3)]
        )
        sel = policy.Selection(inputs(views, catalog=CATALOGS[name]))
        rates, _ = mixed.mixed_upper_rates(sel)
        where = {id(g): j for j, g in enumerate(sel.prepared.mixed)}
        for row in mixed.mixed_candidates(sel):
            bound = rates[where[id(row.graph)]]
            assert row.score <= bound + 1e-12 * max(1.0, abs(bound)), (row.graph.key, row.score, bound)
            checked += 1
    assert checked > 100


def test_mixed_rows_with_unmeasured_programs_are_never_left_out():
    """An unmeasured mixed program's rows are indeterminate (discovery outranks every
    determinate row): the family is scored whatever the floor."""
    rng = np.random.default_rng(29)
    for _ in range(20):
        views = _population(rng)
        costs = measured(SPEC)
        for kind in (GraphKind.MIXED, GraphKind.PREFILL):  # a prefill one too: a floor of inf
            costs._entries.pop(next(g.key for g in SPEC.graphs if g.kind is kind))
        inp = inputs(views, catalog=SPEC, costs=costs)
        _, rows = policy.selection_rows(inp)
        mixed = [_key(r) for r in policy.scored(inp) if r.graph.kind is GraphKind.MIXED]
        assert [_key(r) for r in rows if r.graph.kind is GraphKind.MIXED] == mixed
        assert any(r.indeterminate for r in rows if r.graph.kind is GraphKind.MIXED)


def test_programs_listed_after_a_deferred_ragged_program_are_still_scored():
    """RAGGED with its device ragged program (boundable: deferred) listed before the width-one
    programs: at low acceptance a width-one program wins, and it must still be scored after the
    deferred one, in selection_rows as in scored()."""
    device = next(
        g for g in RAGGED.graphs if g.allocation is not None and g.allocation.value == "prefix_limit"
    )
    graphs = [g for g in RAGGED.graphs if g is not device]
    first = next(i for i, g in enumerate(graphs) if g.kind is GraphKind.SPECULATIVE)
    reordered = dataclasses.replace(RAGGED, graphs=tuple(graphs[:first] + [device] + graphs[first:]))
    views = [decoder(i, survival=geometric(0.05)) for i in range(4)]
    inp = inputs(views, catalog=reordered)
    sel, rows = policy.selection_rows(inp)
    assert [g for g, *_ in sel.prepared.generation_routes].index(device) == 0  # deferred first
    chosen = policy.select(inp, rows=rows)
    assert chosen == policy.select(inp, rows=policy.scored(inp))
    assert chosen.graph.token_capacity == 1  # a width-one program, listed after the deferred one


def test_two_deferred_ragged_programs_keep_scored_order():
    """RAGGED with a second device ragged program (B = 8, W = 2, P = 8) that dominates none, so
    two programs are deferred, listed first and in the middle of the generation programs. The
    rows stay in scored()'s order, each deferred row where scored() has it, select() chooses the
    same, and both outcomes occur: both deferred rows kept, and the second kept after the first
    is left out."""
    from helios_jax.catalog import Allocation, GraphDescriptor

    wide = GraphDescriptor(
        GraphKind.SPECULATIVE,
        8,
        token_capacity=2,
        proposal_depth=3,
        target_capacity=8,
        allocation=Allocation.PREFIX_LIMIT,
        duration_ms=4.9,
    )
    device = next(g for g in RAGGED.graphs if g.allocation is Allocation.PREFIX_LIMIT)
    rest = [g for g in RAGGED.graphs if g is not device]
    first_wide = next(
        i for i, g in enumerate(rest) if g.kind is GraphKind.SPECULATIVE and g.token_capacity > 1
    )
    # Generation order: the wide program first, the width-one ones, the device one, the rest.
    order = [wide, *rest[:first_wide], device, *rest[first_wide:]]
    catalog = dataclasses.replace(RAGGED, graphs=tuple(order))
    rng, outcomes = np.random.default_rng(5), set()
    for _ in range(60):
        views = [
            decoder(
                i,
                x=float(rng.choice([1.0, 8.0])),
                survival=geometric(float(rng.uniform(0.3, 0.97))),
                age_ms=float(rng.uniform(0, 30)),
                output_remaining=int(rng.choice([2, 1000])),
            )
            for i in range(int(rng.integers(2, 9)))
        ]
        _bounded_against_full(views, catalog=catalog)
        inp = inputs(views, catalog=catalog)
        sel, deferred = policy.Selection(inp), []
        generation.generation_candidates(sel, deferred)
        kept = {id(r.graph) for r in policy.selection_rows(inp)[1]}
        outcomes.add(tuple(id(g) in kept for _, g in deferred))
    assert len(deferred) == 2
    assert {(True, True), (False, True)} <= outcomes


@pytest.mark.spec("acceptance-learning/probe-deeper", "acceptance-learning/probe-future-output")
def test_a_probe_that_could_widen_no_lane_builds_no_selection(monkeypatch):
    """A probe lane must be wider than the request's ordinary lane, no wider than the widest
    drafted program, and leave output after it; when no request allows that, the probe returns
    None without building a selection, and it returns what the full search returns whatever the
    population (few decoders, short outputs and narrow ordinary choices among them)."""
    assert not learning._can_widen({7: 5}, {7: 4}, 4)  # one resident on its widest program
    assert not learning._can_widen({7: 5}, {7: 4}, 8)  # wider would leave no output
    assert learning._can_widen({7: 6}, {7: 4}, 8) and learning._can_widen({7: 5}, {7: 3}, 8)
    assert learning._can_widen({7: 3}, {}, 8)  # a decoder the ordinary plan left out: width 1
    assert not learning._can_widen({7: 2}, {}, 8) and not learning._can_widen({7: 9, 8: 1}, {7: 8}, 8)
    assert not learning._can_widen({7: 1000}, {7: 4}, 4) and learning._can_widen({7: 6, 8: 1}, {7: 4}, 8)
    rng, outcomes = np.random.default_rng(13), collections.Counter()
    real_selection = policy.Selection
    for _ in range(150):
        views = [
            decoder(
                rid,
                survival=geometric(float(rng.uniform(0.05, 0.95))),
                output_remaining=int(rng.choice([1, 2, 3, 4, 5, 6, 9, 1000])),
                age_ms=float(rng.uniform(0.0, 40.0)),
            )
            for rid in range(int(rng.integers(1, 4)))
        ]
        inp = inputs(views, catalog=SPEC)
        ordinary = policy.select(inp)
        if ordinary is None or ordinary.indeterminate:
            continue
        optimistic = [dataclasses.replace(v, survival=np.minimum(1.0, v.survival + 0.4)) for v in views]
        info = lambda rid, a, b: 1.0  # noqa: E731
        built = []
        with monkeypatch.context() as m:
            m.setattr(policy, "Selection", lambda *a, built=built: built.append(1) or real_selection(*a))
            bounded = learning.probe(inp, ordinary, optimistic, info)
        with monkeypatch.context() as m:
            m.setattr(learning, "_can_widen", lambda *a: True)
            full = learning.probe(inp, ordinary, optimistic, info)
        assert bounded == full
        outcomes["skipped" if not built else "found" if full is not None else "searched"] += 1
    assert min(outcomes["skipped"], outcomes["found"], outcomes["searched"]) >= 5, outcomes
