"""Ragged speculative followers of a prerequisite (``policy.following.ragged_cohort``): the joint
cohort of a prerequisite and a program whose aggregate target rows P bind as well as its batch,
checked against enumeration, and the dominance of such sequences by smaller followers that do the
same logical work."""

import dataclasses
import itertools

import numpy as np
import pytest

from helios_jax.catalog import Allocation, DecodeMode, GraphDescriptor, GraphKind
from helios_jax.scheduler import policy
from helios_jax.scheduler.policy.following import Pair, ragged_cohort
from helios_jax.scheduler.policy.selection import Selection
from helios_jax.scheduler.view import LaneRole, Phase, RequestView

from .helpers import POLICY, RAGGED, decoder, geometric, measured

HOST_P6 = "speculative[B=4,W=4,D=3,C=0,P=6]"  # ragged-small's host ragged program
DEVICE_P8 = "speculative[B=4,W=4,D=3,C=0,P=8]"  # ragged-small's device ragged program
DEVICE = Allocation.PREFIX_LIMIT


def blocked(rid, **kw) -> RequestView:
    """A stream blocked behind a window snapshot that makes it a ready decoder."""
    return dataclasses.replace(
        decoder(rid, **kw), phase=Phase.BLOCKED, prerequisites=(GraphKind.SNAPSHOT,), enables=Phase.DECODE
    )


def terminal(rid, age_ms=0.0) -> RequestView:
    return RequestView(rid=rid, slot=rid, phase=Phase.TERMINAL, terminal_age_ms=age_ms)


def selection_input(views, extra=(), mode=DecodeMode.ADAPTIVE) -> policy.SelectionInput:
    """ragged-small under `mode`, with `extra` programs measured at their stated durations."""
    costs = measured(RAGGED)
    for g in extra:
        costs.observe(g.key, [g.duration_ms * 1e6], 0)
    graphs = tuple(RAGGED.eligible(mode)) + tuple(extra)
    return policy.SelectionInput(list(views), graphs, costs, 0, POLICY, mode)


def sequences(inp, follower: str, allocation=Allocation.QUERY_LENGTH) -> list:
    """The snapshot sequences whose following program is `follower` (a name) of `allocation`."""
    return [
        c
        for c in policy.candidates(inp)
        if c.kind is GraphKind.SNAPSHOT
        and c.following is not None
        and (c.following.graph.name, c.following.graph.allocation) == (follower, allocation)
    ]


def _follower_rows(c) -> dict[int, tuple[int, int]]:
    """Each follower lane's work besides its role: rid -> (host query length, device ceiling)."""
    return {lane.rid: (lane.query_length, lane.ceiling) for lane in c.following.lanes}


def test_fixed_mode_ragged_follower_serves_the_stream_with_more_expected_tokens():
    """Fixed mode: every lane of the host ragged program B=4, W=4, P=6 queries its full width
    (four rows), so the follower holds one of three streams a snapshot enables (two would need
    eight rows). Equal prices, delivery and ages: a lane is worth output price times its expected
    tokens plus the same delivery value, so the follower serves the stream of highest survival,
    E = 1 + s + s^2 + s^3, after either snapshot shape; the others stay prerequisite rows."""
    survival = {1: 0.5, 2: 0.9, 3: 0.7}
    views = [blocked(rid, survival=geometric(s, 3)) for rid, s in survival.items()]
    cands = sequences(selection_input(views, mode=DecodeMode.FIXED), HOST_P6)
    expected = {rid: 1 + s + s**2 + s**3 for rid, s in survival.items()}
    best = max(expected, key=expected.get)
    assert sorted(c.graph.batch_capacity for c in cands) == [1, 2]
    for c in cands:
        (lane,) = c.following.lanes
        assert (lane.rid, lane.query_length, lane.ceiling) == (best, 4, 0)
        assert lane.expected_tokens == pytest.approx(expected[best])
        assert [lane.rid for lane in c.lanes if lane.role is LaneRole.PREREQUISITE][0] == best


def _host_options(sel: Selection, pair: Pair, views) -> dict[int, float]:
    """Enumeration: the best follower value with exactly k newly ready lanes (no ready
    decoder), over every subset and every host allocation of at most P rows within each lane's
    ceiling, a lane of r rows worth output price * E(r) + delivery, its age reset at U."""
    g2, u, alpha = pair.following, pair.total_ms, sel.decision.alpha
    prices = [sel.decision.scaled(np.array([v.log_output_price, v.log_delivery_price])) for v in views]
    ceiling = [min(v.row_limit, g2.token_capacity, g2.proposal_depth + 1) for v in views]

    def value(i: int, rows: int) -> float:
        v, (output, delivery) = views[i], prices[i]
        expected = 1.0 + float(np.sum(np.asarray(v.survival[: rows - 1]) ** alpha))
        return output * expected + delivery + sel.decision.decode_age * u * (v.age_ms + u)

    best: dict[int, float] = {}
    for k in range(1, min(len(views), g2.batch_capacity, pair.prerequisite.batch_capacity) + 1):
        for subset in itertools.combinations(range(len(views)), k):
            for rows in itertools.product(*(range(1, ceiling[i] + 1) for i in subset)):
                if sum(rows) <= g2.target_capacity:
                    total = sum(value(i, r) for i, r in zip(subset, rows))
                    best[k] = max(best.get(k, -np.inf), total)
    return best


@pytest.mark.parametrize("margin", [-0.5, 0.5, 3.0])
def test_a_terminal_row_competes_with_a_full_prerequisite_for_an_adaptive_ragged_follower(margin):
    """Adaptive mode, a snapshot B=2 before the host ragged program B=4, W=4, P=6: it enables
    both streams (no room left for the terminal row) or one stream and finishes the terminal
    row. Set the terminal row's value `margin` above or below the difference between the best
    two-stream and one-stream followers (by enumeration): the joint cohort is the enumerated
    best, and a full prerequisite adds no terminal value of its own."""
    views = [blocked(1, survival=geometric(0.9, 3)), blocked(2, survival=geometric(0.6, 3))]
    ends = [terminal(3, age_ms=5.0)]
    sel = Selection(selection_input(views + ends))
    g1 = next(g for g in sel.prepared.graphs if g.kind is GraphKind.SNAPSHOT and g.batch_capacity == 2)
    g2 = next(g for g in sel.prepared.graphs if g.name == HOST_P6)
    t1, f = sel.duration(g1), sel.duration(g2)
    pair = Pair(g1, g2, views, ends, np.zeros(1), t1, f, t1 + f)
    best = _host_options(sel, pair, views)
    gap = best[2] - best[1]
    assert gap > 0.5  # either choice is within reach of the terminal row
    pair = dataclasses.replace(pair, terminal_values=np.array([gap + margin]))
    cohort = ragged_cohort(sel, pair, views)
    options = {2: best[2], 1: best[1] + gap + margin}
    k = max(options, key=options.get)
    assert (len(cohort.enabled), cohort.terminal_count) == (k, 2 - k)
    assert cohort.value == pytest.approx(options[k], rel=1e-12)


def test_a_device_ragged_follower_with_the_same_ceilings_as_a_smaller_one_is_dominated():
    """Behind a snapshot, stream 1 and a ready decoder 2 (lower forecast) on ragged-small's device
    program B=4, W=4, P=8, and on an added device program B=4, W=4, P=6 that it dominates.
    A device lane's work is its ceiling (the device allocates rows within P), so both followers
    serve the same work, ceilings 4 and 4, whatever rows each is predicted to give decoder 2:
    the P=8 sequence is dropped, although it is kept without the smaller program."""
    p6 = GraphDescriptor(
        GraphKind.SPECULATIVE,
        4,
        token_capacity=4,
        proposal_depth=3,
        target_capacity=6,
        allocation=Allocation.PREFIX_LIMIT,
        duration_ms=4.6,
    )
    views = [blocked(1, survival=geometric(0.9, 3)), decoder(2, survival=geometric(0.3, 3))]
    (alone,) = sequences(selection_input(views), DEVICE_P8, DEVICE)
    assert _follower_rows(alone) == {1: (0, 4), 2: (0, 4)}
    inp = selection_input(views, extra=[p6])
    (smaller,) = sequences(inp, p6.name, DEVICE)
    assert _follower_rows(smaller) == {1: (0, 4), 2: (0, 4)}
    assert sequences(inp, DEVICE_P8, DEVICE) == []


def test_a_host_ragged_follower_with_the_same_query_lengths_as_a_narrower_one_is_dominated():
    """Behind a snapshot, stream 1 and a ready decoder 2 of equal survival on the host program
    B=4, W=4, P=6, and on an added host program B=4, W=3, P=6 that it dominates. P binds both:
    each lane queries three rows on either, so the wider program does the same logical work
    (a host lane's work is its query length, not the width it could have had) and its sequence is
    dropped, although it is kept without the narrower program."""
    w3 = GraphDescriptor(
        GraphKind.SPECULATIVE,
        4,
        token_capacity=3,
        proposal_depth=3,
        target_capacity=6,
        allocation=Allocation.QUERY_LENGTH,
        duration_ms=4.6,
    )
    views = [blocked(1, survival=geometric(0.8, 3)), decoder(2, survival=geometric(0.8, 3))]
    (alone,) = sequences(selection_input(views), HOST_P6)
    assert _follower_rows(alone) == {1: (3, 0), 2: (3, 0)}
    inp = selection_input(views, extra=[w3])
    (narrower,) = sequences(inp, w3.name)
    assert _follower_rows(narrower) == {1: (3, 0), 2: (3, 0)}
    assert sequences(inp, HOST_P6) == []
