"""Cheap decisions (issue 14), sixth round: a prerequisite's two-stage sequences are scored
before their rows are built, and `selection_rows` builds only those that could matter
(``prerequisites.bounded_entries``). Each test fails when a sequence that matters is left out."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import policy, utility
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import prerequisites, selector
from helios_jax.scheduler.view import Phase, RequestView

from .helpers import ORDINARY, POLICY, SPEC, decoder, geometric, inputs, measured, prompt

CATALOGS = {"spec": (SPEC, DecodeMode.ADAPTIVE), "ordinary": (ORDINARY, DecodeMode.ORDINARY)}
KINDS = (GraphKind.INITIALIZE, GraphKind.SNAPSHOT, GraphKind.RESTORE)


def _blocked(rid: int, rng: np.random.Generator) -> RequestView:
    """A stream behind one or two prerequisites, enabling decode or a prompt."""
    enables = Phase.DECODE if rng.random() < 0.5 else Phase.PREFILL
    if enables is Phase.DECODE:
        base = decoder(rid, x=float(rng.choice([0.5, 2.0])), age_ms=float(rng.uniform(0, 40)))
    else:
        base = prompt(rid, int(rng.choice([40, 700])))
    chain = tuple(KINDS[i] for i in rng.permutation(len(KINDS))[: int(rng.choice([1, 1, 1, 2]))])
    return dataclasses.replace(base, phase=Phase.BLOCKED, prerequisites=chain, enables=enables)


def _population(rng: np.random.Generator) -> list[RequestView]:
    """Ready decoders and prompts, blocked streams and terminal rows, in random numbers."""
    views: list[RequestView] = []
    for _ in range(int(rng.integers(0, 12))):
        views.append(
            decoder(
                len(views),
                x=float(rng.choice([0.5, 1.0, 2.0, 8.0])),
                age_ms=float(rng.uniform(0.0, 60.0)),
                survival=geometric(float(rng.uniform(0.2, 0.9))),
            )
        )
    for _ in range(int(rng.integers(0, 3))):
        views.append(prompt(len(views), int(rng.choice([40, 700]))))
    for _ in range(int(rng.integers(1, 8))):
        views.append(_blocked(len(views), rng))
    for _ in range(int(rng.integers(0, 3))):
        rid = len(views)
        views.append(
            RequestView(rid=rid, slot=rid, phase=Phase.TERMINAL, terminal_age_ms=float(rng.uniform(0, 20)))
        )
    return views


def _key(r: policy.ScoredCandidate) -> tuple:
    return (id(r.graph), r.score, r.duration_ms, r.signature)


def _left_out(inp: policy.SelectionInput) -> list[policy.ScoredCandidate]:
    """The sequences `selection_rows` leaves out of `scored`'s rows, after checking that the kept
    rows are in `scored`'s order, that only rows below the best one are left out, and that
    `select` chooses the same from both."""
    _, rows = policy.selection_rows(inp)
    full = policy.scored(inp, policy.Selection(inp))
    kept = {_key(r) for r in rows}
    assert [_key(r) for r in rows] == [k for k in map(_key, full) if k in kept]
    left = [r for r in full if _key(r) not in kept]
    top = max((r.score for r in full if not r.indeterminate), default=None)
    for r in left:  # sequences, and the fifth round's mixed and adaptive ragged rows
        assert r.graph.kind in (*KINDS, GraphKind.MIXED, GraphKind.SPECULATIVE), r.graph.name
        assert not r.indeterminate and r.score < top and not utility.nearly_equal(r.score, top)
    assert policy.select(inp, rows=rows) == policy.select(inp, rows=full)
    return [r for r in left if r.graph.kind in KINDS]


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_selection_rows_leave_out_only_sequences_that_cannot_be_chosen(name):
    catalog, mode = CATALOGS[name]
    rng, left = np.random.default_rng(5), 0
    for _ in range(60):
        left += len(_left_out(inputs(_population(rng), catalog=catalog, mode=mode)))
    assert left > 0  # the shortcut is taken


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_sequences_alone_are_bounded_by_a_sequence_that_survives_dominance(name):
    """Only streams one prerequisite from their inference: no other row is built (nor a
    continuation), so the floor is the best sequence that no other drops by dominance
    (`prerequisites.surviving_floor`). Durations are drawn at random
    around the catalog's, with initialize and restore programs of 2 and 4 rows beside the
    catalog's (a larger shape often measures faster than a smaller one, whose sequence of the
    same work then drops it): the choice equals the choice over every row, only rows below the
    best are left out, and the shortcut is taken."""
    catalog, mode = CATALOGS[name]
    graphs = tuple(catalog.eligible(mode))
    extra = (GraphDescriptor(k, b) for k in (GraphKind.INITIALIZE, GraphKind.RESTORE) for b in (2, 4))
    graphs += tuple(g for g in extra if g.key not in {h.key for h in graphs})
    rng, left = np.random.default_rng(11), 0
    for _ in range(60):
        costs = CostModel(POLICY.estimate_ttl_ns)
        for g in graphs:
            costs.observe(g.key, [(g.duration_ms or 0.3) * 1e6 * float(np.exp(rng.uniform(-0.7, 0.7)))], 0)
        views = [_blocked(i, rng) for i in range(int(rng.integers(1, 8)))]
        views = [dataclasses.replace(v, prerequisites=v.prerequisites[:1]) for v in views]  # no continuation
        left += len(_left_out(policy.SelectionInput(views, graphs, costs, 0, POLICY, mode)))
    assert left > 0


def test_stale_prerequisites_keep_their_sequences():
    """A stale prerequisite's sequence can be a timing-refresh alternative whatever its score."""
    rng = np.random.default_rng(5)
    stale_ns = 10 * 30_000_000_000  # every estimate past the freshness interval
    for _ in range(30):
        inp = inputs(_population(rng), catalog=ORDINARY, mode=DecodeMode.ORDINARY, now_ns=stale_ns)
        inp = dataclasses.replace(inp, costs=measured(ORDINARY))
        _, rows = policy.selection_rows(inp)
        assert [_key(r) for r in rows] == [_key(r) for r in policy.scored(inp)]


def _snapshot_and_decoders() -> list[RequestView]:
    """One stream behind a window snapshot, enabling decode, and three ready decoders."""
    views = [
        dataclasses.replace(
            decoder(0, x=0.5, age_ms=30.0),
            phase=Phase.BLOCKED,
            prerequisites=(GraphKind.SNAPSHOT,),
            enables=Phase.DECODE,
        )
    ]
    return views + [decoder(i, x=8.0) for i in range(1, 4)]


def test_a_sequence_that_dominates_a_kept_one_is_kept():
    """Snapshot B=1 measured slow (50 ms), B=4 fast: one stream behind a window snapshot and
    ready decoders. Both snapshots' sequences do the same work, so B=4's row is redundant padding
    and dominance drops it, though B=1's scores far below the best row; leaving B=1's row out
    would keep B=4's, which then wins where no padding may."""
    costs = measured(ORDINARY)
    snap1 = next(g for g in ORDINARY.graphs if g.kind is GraphKind.SNAPSHOT and g.batch_capacity == 1)
    costs.observe(snap1.key, [50e6], 0)
    inp = inputs(_snapshot_and_decoders(), catalog=ORDINARY, mode=DecodeMode.ORDINARY, costs=costs)
    full = policy.scored(inp)
    snapshots = [r for r in full if r.graph.kind is GraphKind.SNAPSHOT]
    assert snapshots and all(r.graph.batch_capacity == 1 for r in snapshots)  # B=4's are dominated
    _left_out(inp)
    _, rows = policy.selection_rows(inp)
    assert not any(r.graph.kind is GraphKind.SNAPSHOT and r.graph.batch_capacity == 4 for r in rows)


def test_a_sequence_whose_follower_dominates_a_kept_ones_is_kept():
    """The same on the follower's side: decode B=4 measured slow (50 ms), B=8 fast, one stream
    behind a window snapshot and three ready decoders. Both followers serve the same four rows,
    so the sequence on B=8 is redundant padding, dropped by the one on B=4 although that one
    scores far below the best row; leaving it out would keep B=8's."""
    costs = measured(ORDINARY)
    decode4 = next(
        g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == 4 and g.steps == 1
    )
    costs.observe(decode4.key, [50e6], 0)
    inp = inputs(_snapshot_and_decoders(), catalog=ORDINARY, mode=DecodeMode.ORDINARY, costs=costs)

    def on_eight(rows) -> list:
        return [
            r
            for r in rows
            if r.following is not None
            and r.following.kind is GraphKind.DECODE
            and r.following.batch_capacity == 8
        ]

    assert not on_eight(policy.scored(inp))  # dominated by the sequences on B=4
    _left_out(inp)
    assert not on_eight(policy.selection_rows(inp)[1])


def test_an_unmeasured_prerequisite_keeps_its_sequences():
    """Initialize never measured: its sequences are indeterminate, which outranks every measured
    row whatever their scores, so they are never left out."""
    cold = dataclasses.replace(
        ORDINARY,
        graphs=tuple(
            dataclasses.replace(g, duration_ms=None) if g.kind is GraphKind.INITIALIZE else g
            for g in ORDINARY.graphs
        ),
    )
    views = [
        dataclasses.replace(
            prompt(0, 2, x=500.0),
            phase=Phase.BLOCKED,
            prerequisites=(GraphKind.INITIALIZE,),
            enables=Phase.PREFILL,
        )
    ]
    views += [decoder(i, x=0.05, age_ms=90.0) for i in range(1, 9)]
    inp = inputs(views, catalog=ORDINARY, mode=DecodeMode.ORDINARY, costs=measured(cold))
    _left_out(inp)
    assert policy.select(inp, rows=policy.selection_rows(inp)[1]).graph.kind is GraphKind.INITIALIZE


def _is_sequence(r: policy.ScoredCandidate) -> bool:
    """A two-stage sequence's row: (kind, prerequisite lanes' work, follower, its lanes' work)."""
    return isinstance(r.signature, tuple) and len(r.signature) == 4 and isinstance(r.signature[1], tuple)


def _oracle_kept(inp: policy.SelectionInput, floor: float) -> set:
    """The sequences `bounded_entries` must build, from the built rows: those built whatever
    their score (a ragged follower's), indeterminate or stale ones, those not below `floor` by
    more than four tie tolerances, and every one whose pair of shapes dominates a kept one's
    (each the same or smaller, not both the same; the followers of one class, with as many
    lanes)."""
    sel = policy.Selection(inp)
    entries = prerequisites.prerequisite_entries(sel)
    eager = {id(e) for e in entries if not isinstance(e, prerequisites.Sequence)}  # ragged followers
    rows = [e.row() if isinstance(e, prerequisites.Sequence) else e for e in entries]
    margin = 4.0 * utility.REL_TIE

    def must(r) -> bool:
        if id(r) in eager or r.indeterminate or sel.is_stale(r.graph):
            return True
        if floor == float("inf"):
            return False
        return not r.score < floor - margin * max(1.0, abs(r.score), abs(floor))

    kept = [r for r in rows if must(r)]
    dominators = sel.prepared.dominators

    def same_or_dominating(g, h) -> bool:
        return g is h or g in dominators[h]

    for r in rows:
        if _is_sequence(r) and any(
            _is_sequence(k)
            and k.signature[2] == r.signature[2]
            and len(k.signature[3]) == len(r.signature[3])  # as many follower lanes
            and (r.graph, r.following) != (k.graph, k.following)
            and same_or_dominating(r.graph, k.graph)
            and same_or_dominating(r.following, k.following)
            for k in kept
        ):
            kept.append(r)
    return {_key(r) for r in kept}


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_selection_rows_build_no_sequence_beyond_those_that_could_matter(name):
    """The shortcut's extent: every sequence row `selection_rows` keeps is one the rules ask for
    (scored from its built row; an oracle over every row), so a wrong score, a wrong floor or a
    closure over other followers' sequences shows as rows built for nothing."""
    catalog, mode = CATALOGS[name]
    rng = np.random.default_rng(9)
    for _ in range(40):
        inp = inputs(_population(rng), catalog=catalog, mode=mode)
        full = policy.scored(inp, policy.Selection(inp))
        # A floor at most selection_rows' own: the other rows but mixed and speculative ones
        # (those the fifth round's bounds may still be holding back when the floor is taken).
        others = [
            r
            for r in full
            if not _is_sequence(r) and r.graph.kind not in (GraphKind.MIXED, GraphKind.SPECULATIVE)
        ]
        floor = selector._best_score(others)
        if floor is None:
            continue
        _, rows = policy.selection_rows(inp)
        built = {_key(r) for r in rows if _is_sequence(r)}
        assert built <= _oracle_kept(inp, floor)


@pytest.mark.parametrize("floor", [1e-6, 0.3, 1.0, 7.0, 1e6, -2.0, -1e6])
def test_a_score_nearly_equal_to_the_floor_is_never_left_out(floor):
    """A sequence is left unbuilt only when it can be neither the choice nor tied with it: a score
    nearly equal to the floor (``utility.nearly_equal``: within ``REL_TIE`` relative to the
    larger magnitude, absolute below one) could tie with a best row at the floor, at any
    magnitude, so it is never below; far under the floor (ten tolerances) it is."""
    tol = utility.REL_TIE * max(1.0, abs(floor))
    for gap in (0.0, 0.5, 0.99):
        score = floor - gap * tol
        assert utility.nearly_equal(score, floor)
        assert not prerequisites._below(score, floor)
    assert prerequisites._below(floor - 10.0 * tol, floor)
    # an infinite floor: an indeterminate best row outranks every determinate one
    assert prerequisites._below(floor, float("inf")) and not prerequisites._below(floor, -float("inf"))


@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_a_kinds_followers_are_resolved_once_for_every_prerequisite_shape(name, monkeypatch):
    """Streams waiting for an initialize program, which several prepared shapes could run:
    each (kind, enabled phase) resolves its followers once (`prerequisites._live_followers`),
    however many shapes of the kind offer sequences, and those shapes' sequences all follow
    from it."""
    catalog, mode = CATALOGS[name]
    graphs = tuple(catalog.eligible(mode))
    extra = (GraphDescriptor(GraphKind.INITIALIZE, b) for b in (2, 4))
    graphs += tuple(g for g in extra if g.key not in {h.key for h in graphs})
    costs = CostModel(POLICY.estimate_ttl_ns)
    for g in graphs:
        costs.observe(g.key, [(g.duration_ms or 0.3) * 1e6], 0)
    rng = np.random.default_rng(3)
    views = [dataclasses.replace(_blocked(i, rng), prerequisites=(GraphKind.INITIALIZE,)) for i in range(6)]
    calls = []
    real = prerequisites._live_followers
    monkeypatch.setattr(
        prerequisites,
        "_live_followers",
        lambda sel, enables, singles: calls.append(enables) or real(sel, enables, singles),
    )
    entries = prerequisites.prerequisite_entries(
        policy.Selection(policy.SelectionInput(views, graphs, costs, 0, POLICY, mode))
    )
    shapes = {e.prerequisite.batch_capacity for e in entries if isinstance(e, prerequisites.Sequence)}
    assert len(shapes) >= 2  # several initialize shapes offer sequences
    assert sorted(calls) == sorted({v.enables for v in views}) and len(calls) == len(set(calls))
