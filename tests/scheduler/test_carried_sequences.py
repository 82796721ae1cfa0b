"""A prerequisite shape whose smaller shape of its kind holds every blocked row of the kind offers
no sequence when it finishes no terminal row (``prerequisites._carried``, RESOLUTIONS 37): it is
redundant padding. With a prefill follower (the eighth round of issue 14) the smaller shape's
sequence takes the same cohort and dropped it by dominance already; with a decode-like follower
the padded shape's own measured time could change the cohort through the sequence's length and
keep its row. The rows must be the full enumeration's without the padded ones."""

from __future__ import annotations

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference.crosscheck import with_prefill_batch
from helios_jax.scheduler import policy
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import prerequisites, selector
from helios_jax.scheduler.policy.prepared import dominates
from helios_jax.scheduler.policy.prerequisites import Sequence
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.view import Phase

from .helpers import ORDINARY, POLICY, SPEC, decoder
from .test_plan_cost_sequences import _key, _population
from .test_prerequisites import blocked

# Prerequisite shapes beside the catalogs' one-row ones (durations drawn per case).
EXTRA = tuple(
    GraphDescriptor(kind, b)
    for kind in (GraphKind.INITIALIZE, GraphKind.RESTORE, GraphKind.SNAPSHOT)
    for b in (2, 4, 16)
)
CATALOGS = {"spec": (SPEC, DecodeMode.ADAPTIVE), "ordinary": (ORDINARY, DecodeMode.ORDINARY)}


def _inputs(catalog, mode, views, rng) -> policy.SelectionInput:
    """The catalog with four-row prefill and every prerequisite shape of EXTRA, each measured at
    a random duration (a larger shape may be the faster), views as given."""
    cat = with_prefill_batch(catalog, (4,))
    costs = CostModel(POLICY.estimate_ttl_ns)
    costs.seed_from_catalog(cat, 0)
    for g in EXTRA + tuple(g for g in cat.graphs if g.kind in (GraphKind.INITIALIZE, GraphKind.RESTORE)):
        costs.observe(g.key, [float(rng.uniform(0.05, 2.0)) * 1e6], 0)
    graphs = (*cat.eligible(mode), *EXTRA)
    return policy.SelectionInput(views, graphs, costs, 0, POLICY, mode)


def _padded(sel: Selection, r: policy.ScoredCandidate) -> bool:
    """A sequence row whose prerequisite has a smaller shape of its kind (a dominator in the
    catalog) holding every blocked row of the kind, with no terminal row it could finish."""
    if r.following is None or (r.graph.kind is GraphKind.SNAPSHOT and sel.terminals):
        return False
    group = sum(1 for v in sel.blocked if v.prerequisites[0] is r.graph.kind)
    return any(
        h.kind is r.graph.kind and dominates(h, r.graph) and h.batch_capacity >= group
        for h in sel.prepared.graphs
    )


@pytest.mark.spec(
    "prerequisites/all-shape-pairs", "useful-service/dominance-prune", "useful-service/no-padding-preference"
)
@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_rows_are_every_shape_pairs_without_the_padded_prerequisites(name, monkeypatch):
    """Random populations (ready and blocked streams, terminal rows) with every prerequisite
    shape measured at a random duration: the scored rows are those with every (prerequisite,
    follower) pair scored, in order, less the padded prerequisites' sequences, and the choice is
    the full enumeration's unless that is a padded one. Some padded rows survive the dominance
    filter in the full enumeration (a decode-like follower's cohort changed by the padded
    shape's time): the code before this reading kept them."""
    catalog, mode = CATALOGS[name]
    rng = np.random.default_rng(7)
    padded = 0
    for _ in range(40):
        inp = _inputs(catalog, mode, _population(rng), rng)
        sel = Selection(inp)
        fast = [_key(r) for r in selector.scored(inp)]
        fast_choice = policy.select(inp)
        with monkeypatch.context() as m:
            m.setattr(prerequisites, "_carried", lambda sel, g1, n: False)
            full = selector.scored(inp)
            full_choice = policy.select(inp)
        assert fast == [_key(r) for r in full if not _padded(sel, r)]
        padded += sum(_padded(sel, r) for r in full)
        if full_choice is not None and full_choice.following is not None:
            if any(_padded(sel, r) and r.graph is full_choice.graph for r in full):
                continue  # the full enumeration chose padding
        assert (fast_choice is None) == (full_choice is None)
        if fast_choice is not None:
            assert (fast_choice.graph, fast_choice.rids) == (full_choice.graph, full_choice.rids)
    assert padded > 0


def _prefill_sequences(inp) -> set[tuple[int, str]]:
    entries = prerequisites.prerequisite_entries(Selection(inp))
    return {
        (e.prerequisite.batch_capacity, e.following.name)
        for e in entries
        if isinstance(e, Sequence) and e.following.kind.is_prefill
    }


@pytest.mark.spec("prerequisites/all-shape-pairs")
def test_only_the_smallest_shape_holding_the_group_offers_prefill_followers():
    """One prompt behind an initialization: only INITIALIZE B = 1 is paired with prefill
    followers. Three: B = 1 and 2 (which do not hold them), B = 4 (the smallest that does), not
    B = 16."""
    rng = np.random.default_rng(0)
    one = [blocked(1, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=100)]
    three = one + [blocked(r, [GraphKind.INITIALIZE], Phase.PREFILL, tokens=100) for r in (2, 3)]
    by_b = {b for b, _ in _prefill_sequences(_inputs(ORDINARY, DecodeMode.ORDINARY, one, rng))}
    assert by_b == {1}
    by_b = {b for b, _ in _prefill_sequences(_inputs(ORDINARY, DecodeMode.ORDINARY, three, rng))}
    assert by_b == {1, 2, 4}
    sel = Selection(_inputs(ORDINARY, DecodeMode.ORDINARY, three, rng))
    shapes = {g.batch_capacity: g for g in sel.prepared.prerequisites if g.kind is GraphKind.INITIALIZE}
    assert [prerequisites._carried(sel, shapes[b], 3) for b in (1, 2, 4, 16)] == [False, False, False, True]


@pytest.mark.spec("useful-service/dominance-prune", "useful-service/no-padding-preference")
def test_a_padded_prerequisite_offers_no_decode_follower_whatever_its_time(monkeypatch):
    """Two decoders waiting for their snapshot, two ready ones, snapshots of B = 2 (0.8 ms) and
    B = 4 (18 ms): B = 2 holds both. Followed by decode[B=2], B = 2's short sequence serves one
    waiting decoder and the older ready one; B = 4's long one would serve both waiting decoders
    (their age terms grow with the sequence): another cohort, so dominance kept it. It is the
    padding's time that changed the cohort: B = 4 offers no sequence."""
    snapshot = {b: GraphDescriptor(GraphKind.SNAPSHOT, b) for b in (2, 4)}
    costs = CostModel(POLICY.estimate_ttl_ns)
    costs.seed_from_catalog(ORDINARY, 0)
    costs.observe(snapshot[2].key, [0.8e6], 0)
    costs.observe(snapshot[4].key, [18e6], 0)
    views = [blocked(i, [GraphKind.SNAPSHOT], Phase.DECODE) for i in range(2)]
    views += [decoder(10, age_ms=36.0), decoder(11, age_ms=47.0)]
    graphs = (*ORDINARY.eligible(DecodeMode.ORDINARY), *snapshot.values())
    inp = policy.SelectionInput(views, graphs, costs, 0, POLICY, DecodeMode.ORDINARY)

    def follower_rids(rows) -> dict[int, list[int]]:
        return {
            r.graph.batch_capacity: sorted(lane.rid for lane in r.build().following.lanes)
            for r in rows
            if r.graph in snapshot.values() and r.following.name.startswith("decode[B=2,")
        }

    assert follower_rids(selector.scored(inp)) == {2: [0, 11]}
    with monkeypatch.context() as m:
        m.setattr(prerequisites, "_carried", lambda sel, g1, n: False)
        assert follower_rids(selector.scored(inp)) == {2: [0, 11], 4: [0, 1]}
