"""The tie order inside prerequisite cohorts, with populations large enough to need it.

Equal lane values go to the least recently used request (one never selected first), then to the
earlier admitted (docs/spec/RESOLUTIONS.md entry 24): the selection orders its views that way and
every cohort solver sorts lanes stably by value. numpy's default sort is unstable once an array
holds more than 16 elements, so these populations hold 24 rows whose values tie in three levels,
listed in a shuffled order; the cohort must cut the tied level by recency, then rid.
"""

import random

import pytest

from helios_jax.catalog import GraphDescriptor, GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.view import LaneRole, Phase

from .helpers import decoder
from .test_prerequisites import blocked, terminal, with_graphs

spec = pytest.mark.spec

# Token rates of the three value levels: the lower the rate, the higher the lane value.
LEVELS = (1.0, 2.0, 4.0)
DECODE_B8 = "decode[B=8,W=1,D=0,C=0,P=8]"
DECODE_B16 = "decode[B=16,W=1,D=0,C=0,P=16]"
INIT_B8 = GraphDescriptor(GraphKind.INITIALIZE, 8, duration_ms=0.2)


def _population(sizes, seed):
    """(rid, x, last_selected_ns) for each row: `sizes[i]` rows at LEVELS[i], with recencies
    shuffled across rids and three rows never selected (-1), so both recency and rid decide."""
    rng = random.Random(seed)
    n = sum(sizes)
    recency = [-1, -1, -1] + [10 * (i + 1) for i in range(n - 3)]
    rng.shuffle(recency)
    xs = [x for x, size in zip(LEVELS, sizes) for _ in range(size)]
    rng.shuffle(xs)
    return [(rid, xs[rid - 1], recency[rid - 1]) for rid in range(1, n + 1)]


def _tie_order(rows, k):
    """The first `k` rows in value order (lower x first), equal values least recently used
    first, then by rid."""
    return tuple(rid for rid, _, _ in sorted(rows, key=lambda r: (r[1], r[2], r[0]))[:k])


def _shuffled(views, seed):
    views = list(views)
    random.Random(seed).shuffle(views)
    return views


def _pair(views, extra, g1_batch, g2_name):
    inp = with_graphs(extra, views=views)
    return next(
        c
        for c in policy.candidates(inp)
        if c.kind is GraphKind.INITIALIZE
        and c.graph.batch_capacity == g1_batch
        and c.following is not None
        and c.following.graph.name == g2_name
    )


@spec("duration-estimates/tie-order", "prerequisites/joint-cohorts")
def test_newly_ready_rows_of_equal_value_follow_the_tie_order():
    """24 streams blocked behind initialization, each to decode next: 5 at the highest value,
    10 at the middle, 9 at the lowest (token rates 1, 2, 4; equal z, age, survival). The pair
    (initialize B=8, decode B=8) enables and serves 8 of them: the 5 best and 3 of the 10 tied
    middle ones, which must be the least recently used (never selected first, then by rid),
    in that order, whatever order the views are listed in."""
    rows = _population((5, 10, 9), seed=1)
    views = [
        blocked(rid, [GraphKind.INITIALIZE], Phase.DECODE, x=x, last_selected_ns=last)
        for rid, x, last in rows
    ]
    c = _pair(_shuffled(views, 2), [INIT_B8], 8, DECODE_B8)
    want = _tie_order(rows, 8)
    assert c.following.rids == want
    assert {lane.rid for lane in c.lanes} == set(want)
    assert all(lane.role is LaneRole.PREREQUISITE for lane in c.lanes)


@spec("duration-estimates/tie-order", "prerequisites/following-ready")
def test_already_ready_rows_of_equal_value_follow_the_tie_order():
    """One stream blocked behind initialization (B=1) and 24 ready decoders: 6 at the highest
    value, 12 at the middle, 6 at the lowest (token rates 1, 2, 4). Decode B=16 follows with the
    newly ready stream and 15 ready decoders: the 6 best and 9 of the 12 tied middle ones, which
    must be the least recently used (never selected first, then by rid), in that order."""
    rows = _population((6, 12, 6), seed=3)
    views = [decoder(rid, x=x, last_selected_ns=last) for rid, x, last in rows]
    views.append(blocked(100, [GraphKind.INITIALIZE], Phase.DECODE))
    c = _pair(_shuffled(views, 4), [], 1, DECODE_B16)
    assert c.following.rids == (100,) + _tie_order(rows, 15)
    assert c.rids == (100,)


@spec("duration-estimates/tie-order", "prerequisites/continuation-aggregate")
def test_continuation_rows_of_equal_value_follow_the_tie_order():
    """24 streams behind initialization and then restore, each to decode next: 5 at the highest
    value, 10 at the middle, 9 at the lowest (token rates 1, 2, 4; equal continuation index
    V*T/(T+F) within a level). Initialize B=8's continuation candidate advances the 5 best and 3
    of the 10 tied middle ones, which must be the least recently used (never selected first,
    then by rid), in that order."""
    rows = _population((5, 10, 9), seed=5)
    views = [
        blocked(rid, [GraphKind.INITIALIZE, GraphKind.RESTORE], Phase.DECODE, x=x, last_selected_ns=last)
        for rid, x, last in rows
    ]
    inp = with_graphs([INIT_B8], views=_shuffled(views, 6))
    c = next(
        c
        for c in policy.candidates(inp)
        if c.kind is GraphKind.INITIALIZE and c.graph.batch_capacity == 8 and c.following is None
    )
    assert c.rids == _tie_order(rows, 8)
    assert all(lane.role is LaneRole.PREREQUISITE and lane.value > 0 for lane in c.lanes)


@spec("duration-estimates/tie-order", "prerequisites/first-finishes-terminal")
def test_terminal_rows_of_equal_value_retired_before_a_follower_follow_the_tie_order():
    """One stream blocked behind a snapshot and 24 terminal rows: 5 at the highest value, 10 at
    the middle, 9 at the lowest (terminal ages 40, 20, 5 ms). Snapshot B=8 followed by decode B=1
    takes the stream and retires 7 terminal rows: the 5 oldest and 2 of the 10 tied middle ones,
    which must be the least recently used (never selected first, then by rid), in that order."""
    ages = dict(zip(LEVELS, (40.0, 20.0, 5.0)))
    rows = _population((5, 10, 9), seed=7)
    views = [terminal(rid, age_ms=ages[x], last_selected_ns=last) for rid, x, last in rows]
    views.append(blocked(100, [GraphKind.SNAPSHOT], Phase.DECODE))
    snapshot_b8 = GraphDescriptor(GraphKind.SNAPSHOT, 8, duration_ms=0.2)
    inp = with_graphs([snapshot_b8], views=_shuffled(views, 8))
    c = next(
        c
        for c in policy.candidates(inp)
        if c.kind is GraphKind.SNAPSHOT
        and c.graph.batch_capacity == 8
        and c.following is not None
        and c.following.graph.name == "decode[B=1,W=1,D=0,C=0,P=1]"
    )
    assert c.following.rids == (100,)
    assert tuple(lane.rid for lane in c.lanes if lane.role is LaneRole.TERMINAL) == _tie_order(rows, 7)
