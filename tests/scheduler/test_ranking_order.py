"""The candidate tie order's recency key for requests the recency map lacks, and the dominance
filter's groups for terminal snapshots and two-stage sequences (``policy.ranking``,
``policy.snapshots``).

Dominance drops a shape only against another doing the same logical work: a terminal snapshot
that also advances more blocked rows is other work, while a sequence whose prerequisite is a
larger shape of the same kind doing the same rows is redundant padding whatever its time."""

from __future__ import annotations

import dataclasses

import pytest

from helios_jax.catalog import DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.cost import CostModel
from helios_jax.scheduler.policy import prerequisites, ranking, selector
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.view import Candidate, Lane, LaneRole, Phase

from .helpers import ORDINARY, POLICY, decoder
from .test_prerequisites import blocked, terminal

spec = pytest.mark.spec
SNAPSHOTS = {b: GraphDescriptor(GraphKind.SNAPSHOT, b) for b in (1, 2, 4)}


def _decode(batch: int, rid: int) -> Candidate:
    """One decode lane for `rid` on ORDINARY's decode program of batch `batch`, score 10 in
    3.6 ms: candidates built this way tie on score, time and served requests."""
    graph = next(g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == batch)
    lanes = (Lane(rid, rid, LaneRole.DECODE, query_length=1),)
    return Candidate(graph=graph, lanes=lanes, duration_ms=3.6, score=10.0, useful_value=10.0, log_scale=0.0)


@spec("duration-estimates/tie-order")
def test_a_request_absent_from_the_recency_map_is_older_than_one_selected_at_time_zero():
    """Request 1 was selected by the first decision of a run whose clock starts at 0 ns; request
    2 is absent from the recency map: never selected, so less recently used than request 1
    however early its selection was. The candidates tie on every earlier key (same program,
    score, time, one request each): the never-selected request wins, in both argument orders."""
    recent, never = _decode(1, 1), _decode(1, 2)
    recency = {1: 0}
    assert policy.better(never, recent, recency)
    assert not policy.better(recent, never, recency)


@spec("duration-estimates/tie-order")
def test_a_request_absent_from_the_recency_map_ties_with_one_never_selected():
    """A request absent from the map and one recorded as never selected (the RequestView default
    last_selected_ns = -1) are equally recent, so the next key, padding, decides: request 1
    alone on decode B = 1 (no padding) beats request 2 alone on decode B = 2 (one padded row),
    in both argument orders; so does ``best`` over views that record request 1 only."""
    unpadded, padded = _decode(1, 1), _decode(2, 2)
    recency = {1: -1}
    assert policy.better(unpadded, padded, recency)
    assert not policy.better(padded, unpadded, recency)
    views = [decoder(1)]
    assert views[0].last_selected_ns == -1
    assert policy.best([padded, unpadded], views) is unpadded


def _snapshot_inputs(views, durations_ms: dict[int, float]) -> policy.SelectionInput:
    """ORDINARY's programs with snapshot programs of the given batch capacities in place of its
    own, each measured once at the given duration (the others as the catalog seeds them)."""
    others = tuple(g for g in ORDINARY.eligible(DecodeMode.ORDINARY) if g.kind is not GraphKind.SNAPSHOT)
    costs = CostModel(POLICY.estimate_ttl_ns)
    costs.seed_from_catalog(dataclasses.replace(ORDINARY, graphs=others), 0)
    for b, t in durations_ms.items():
        costs.observe(SNAPSHOTS[b].key, [t * 1e6], 0)
    graphs = others + tuple(SNAPSHOTS[b] for b in durations_ms)
    return policy.SelectionInput(list(views), graphs, costs, 0, POLICY, DecodeMode.ORDINARY)


def _terminal_rows(rows) -> dict[int, int]:
    """The terminal snapshot rows (no follower): batch capacity -> blocked rows it advances."""
    return {
        r.graph.batch_capacity: sum(lane.role is LaneRole.PREREQUISITE for lane in r.build().lanes)
        for r in rows
        if r.graph.kind is GraphKind.SNAPSHOT and r.following is None
    }


@spec("useful-service/dominance-prune", "prerequisites/free-unused-capacity")
def test_a_terminal_snapshot_advancing_more_blocked_rows_is_other_work():
    """One finished request and three decoders waiting for their snapshot. Snapshot B = 2
    (1 ms) retires the terminal row and advances one waiting decoder with its free row; B = 4
    (0.5 ms) retires it and advances all three: more logical work, so B = 2's smaller shape
    does not dominate it. B = 1 (2 ms) retires the terminal row alone. Each row is worth the
    terminal row's value alone, so the fastest, B = 4, is the choice."""
    views = [terminal(1, age_ms=5.0)] + [
        blocked(10 + i, [GraphKind.SNAPSHOT], Phase.DECODE) for i in range(3)
    ]
    inp = _snapshot_inputs(views, {1: 2.0, 2: 1.0, 4: 0.5})
    assert _terminal_rows(selector.scored(inp)) == {1: 0, 2: 1, 4: 3}
    assert _terminal_rows(policy.selection_rows(inp)[1]) == {1: 0, 2: 1, 4: 3}
    chosen = policy.select(inp)
    assert chosen.graph is SNAPSHOTS[4] and chosen.following is None
    assert sorted(lane.rid for lane in chosen.lanes) == [1, 10, 11, 12]


@spec("useful-service/dominance-prune", "useful-service/no-padding-preference")
def test_a_sequence_on_a_padded_prerequisite_is_discarded_whatever_its_time():
    """One finished request and one decoder waiting for its snapshot. Snapshot B = 2 (1 ms) and
    B = 4 (0.25 ms) can each retire the terminal row and enable the decoder for the same
    follower: the same logical work, B = 4 with two more padded rows. Measured four times
    faster, its sequences would outscore B = 2's; the dominance filter discards every B = 4 row
    (its terminal rows too), keeping B = 2's sequences. B = 1 cannot hold both rows."""
    views = [terminal(1, age_ms=5.0), blocked(10, [GraphKind.SNAPSHOT], Phase.DECODE)]
    inp = _snapshot_inputs(views, {1: 0.3, 2: 1.0, 4: 0.25})
    offered = prerequisites.prerequisite_candidates(Selection(inp))
    padded = [r for r in offered if r.graph is SNAPSHOTS[4]]
    smaller = {r.following.name: r for r in offered if r.graph is SNAPSHOTS[2]}
    assert padded and all(r.signature == smaller[r.following.name].signature for r in padded)
    assert all(r.score > smaller[r.following.name].score for r in padded)
    rows = selector.scored(inp)
    assert any(r.graph is SNAPSHOTS[2] and r.following is not None for r in rows)
    assert not any(r.graph is SNAPSHOTS[4] for r in rows)
    assert not any(r.graph is SNAPSHOTS[4] for r in policy.selection_rows(inp)[1])


@spec("useful-service/dominance-prune")
def test_a_pair_is_dominated_by_one_of_dominating_or_equal_shapes_not_itself():
    """A two-stage sequence (g1, g2) is dominated by a sequence of the same work whose
    prerequisite and follower are each the same shape or a dominating (smaller) one, not both
    the same; a larger shape in either stage does not dominate it."""
    small, large = SNAPSHOTS[2], SNAPSHOTS[4]
    d1, d2 = (
        next(g for g in ORDINARY.graphs if g.kind is GraphKind.DECODE and g.batch_capacity == b)
        for b in (1, 2)
    )
    prepared = policy.as_prepared((small, large, d1, d2))
    dom = prepared.dominator_ids

    def dominated(pair, by):
        return ranking.pair_dominated(*pair, [by], dom)

    assert dominated((large, d2), (small, d2))  # a smaller prerequisite, the same follower
    assert dominated((large, d2), (large, d1))  # the same prerequisite, a smaller follower
    assert dominated((large, d2), (small, d1))  # both smaller
    assert not dominated((large, d2), (large, d2))  # itself
    assert not dominated((small, d2), (large, d2)) and not dominated((large, d1), (large, d2))
    assert not dominated((large, d2), (small, None))  # a single-program row is no sequence
