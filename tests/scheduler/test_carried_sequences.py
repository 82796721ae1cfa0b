"""Cheap decisions (issue 14), eighth round: a prerequisite shape whose smaller shape of its kind
holds every blocked row of the kind offers no sequence with a prefill follower when it finishes
no terminal row (``prerequisites._carried``): the smaller shape's sequence takes the same cohort
and drops it by dominance. The rows and the choice must be those of the full enumeration."""

from __future__ import annotations

import numpy as np
import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.reference.crosscheck import with_prefill_batch
from helios_jax.scheduler import policy
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import prerequisites, selector
from helios_jax.scheduler.policy.prerequisites import Sequence
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.view import Phase

from .helpers import ORDINARY, POLICY, SPEC
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


@pytest.mark.spec("prerequisites/all-shape-pairs", "useful-service/dominance-prune")
@pytest.mark.parametrize("name", sorted(CATALOGS))
def test_rows_and_choice_equal_those_of_every_shape_pair(name, monkeypatch):
    """Random populations (ready and blocked streams, terminal rows): the scored rows and the
    choice with the shortcut equal those with every (prerequisite, follower) pair scored."""
    catalog, mode = CATALOGS[name]
    rng = np.random.default_rng(7)
    carried = 0
    for _ in range(15):
        inp = _inputs(catalog, mode, _population(rng), rng)
        fast = [_key(r) for r in selector.scored(inp)]
        fast_choice = policy.select(inp)
        sel = Selection(inp)
        carried += sum(prerequisites._carried(sel, g, 1) for g in sel.prepared.prerequisites)
        with monkeypatch.context() as m:
            m.setattr(prerequisites, "_carried", lambda sel, g1, n: False)
            assert [_key(r) for r in selector.scored(inp)] == fast
            full_choice = policy.select(inp)
        assert (fast_choice is None) == (full_choice is None)
        if fast_choice is not None:
            assert (fast_choice.graph, fast_choice.rids) == (full_choice.graph, full_choice.rids)
    assert carried > 0


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
